//! A device whose out-of-band channel listens on another address than its own (`;oob=`,
//! for a card whose IP is not an address of the host): SEND/RECV still work, the engine
//! naming peers by their device IPs and the channel reaching them at their channel
//! addresses. Two emulated devices at 127.0.10.1/2 with their channels on 127.0.11.1/2.

use bluerdma_tests::connect_pair;
use bluerdma_tests::served::{exercise, open_all};

#[test]
fn send_and_recv_reach_peers_whose_channel_is_on_another_address() {
    let devs = open_all("a=127.0.10.1;oob=127.0.11.1,b=127.0.10.2;oob=127.0.11.2");
    let (a, b) = (&devs[0], &devs[1]);
    let (sa, sb) = connect_pair(a, b, (0, 0), 14, 7);
    exercise(a, b, (&sa, &sb), 11);
    exercise(b, a, (&sb, &sa), 13);
    // The channels listen where they were told to and nowhere else.
    assert!(std::net::TcpStream::connect("127.0.11.1:60000").is_ok());
    assert!(std::net::TcpStream::connect("127.0.10.1:60000").is_err());
}
