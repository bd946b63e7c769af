//! The connection manager against bad peers and at its limits: private data at and past
//! the IB spec's sizes, rejections and their reasons, nobody listening, garbage and
//! half-open connections on the CM port, a peer that never answers, peers that die in the
//! middle of the handshake, disconnects from either side, UD ids, the event channel's fd
//! `rdma_migrate_id` and ECE options. Every failure must be the documented event or errno, never a
//! hang: each wait is bounded ([`common::EVENT_WAIT`]).
//!
//! Devices of this binary: 127.0.4.1 (listeners), 127.0.4.2 (clients) and three that no
//! library listens on, where fake peers (or nobody) sit on the CM port: 127.0.4.3
//! (nobody), 127.0.4.4 (accepts and never answers) and 127.0.4.5 (reads the request, then
//! closes). The CM timeout is 1.5 s.

mod common;

use common::abi::*;
use common::*;
use core::ffi::c_void;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::time::Duration;

const SRV: Ipv4Addr = Ipv4Addr::new(127, 0, 4, 1);
const CLI: Ipv4Addr = Ipv4Addr::new(127, 0, 4, 2);
const NOBODY: Ipv4Addr = Ipv4Addr::new(127, 0, 4, 3);
const SILENT: Ipv4Addr = Ipv4Addr::new(127, 0, 4, 4);
const CLOSER: Ipv4Addr = Ipv4Addr::new(127, 0, 4, 5);
const CM_PORT: u16 = 60001;
const TIMEOUT_MS: u64 = 1500;

fn api() -> &'static Api {
    common::api(
        "srv=127.0.4.1,cli=127.0.4.2,nobody=127.0.4.3,silent=127.0.4.4,closer=127.0.4.5",
        TIMEOUT_MS,
    )
}

/// A REQ for `port` as the CM protocol lays it out (wire.rs, version 2): header, port
/// space, ports, QPN, PSN, MTU, the six parameter bytes, no ECE and no private data.
fn raw_req(port: u16) -> Vec<u8> {
    let mut b = b"BRCM\x02\x01\x00\x1e".to_vec();
    b.extend_from_slice(&0x0106u16.to_be_bytes());
    b.extend_from_slice(&port.to_be_bytes());
    b.extend_from_slice(&40000u16.to_be_bytes());
    b.extend_from_slice(&0x123u32.to_be_bytes());
    b.extend_from_slice(&0x456u32.to_be_bytes());
    b.extend_from_slice(&[5, 1, 1, 1, 7, 7, 0]);
    b.extend_from_slice(&[0; 8]);
    b.push(0);
    b
}

/// A TCP connection to the CM port of `ip`, from the client device's address.
fn cm_stream(ip: Ipv4Addr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddrV4::new(CLI, 0).into()).unwrap();
    s.connect(&SocketAddrV4::new(ip, CM_PORT).into()).unwrap();
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(EVENT_WAIT)).unwrap();
    s
}

/// Reads until the peer closes; what it sent. Panics if it does not close in time.
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return all,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return all,
            Err(e) => panic!("the CM did not close the connection: {e}"),
        }
    }
}

/// A connected pair: (client id, server id), with QPs, both ESTABLISHED.
fn connected(
    a: &Api,
    lch: *mut RdmaEventChannel,
    cch: *mut RdmaEventChannel,
    port: u16,
) -> (*mut RdmaCmId, *mut RdmaCmId) {
    let cli = a.resolved(cch, RDMA_PS_TCP, CLI, SocketAddrV4::new(SRV, port));
    a.qp(cli, false);
    let p = conn_param(&[]);
    // SAFETY: a route-resolved id.
    assert_eq!(unsafe { (a.rdma_connect)(cli, &p) }, 0);
    let child = a.expect(lch, RDMA_CM_EVENT_CONNECT_REQUEST, false).id;
    a.qp(child, false);
    // SAFETY: a connect request's id.
    assert_eq!(unsafe { (a.rdma_accept)(child, &p) }, 0);
    a.expect(cch, RDMA_CM_EVENT_ESTABLISHED, false);
    a.expect(lch, RDMA_CM_EVENT_ESTABLISHED, false);
    (cli, child)
}

/// Destroys ids (their QPs first).
fn destroy(a: &Api, ids: &[*mut RdmaCmId]) {
    for &id in ids {
        // SAFETY: ids of this test, given up.
        unsafe {
            (a.rdma_destroy_qp)(id);
            assert_eq!((a.rdma_destroy_id)(id), 0);
        }
    }
}

/// Connects `cli` to whatever is at `to` and returns the first event.
fn connect_event(a: &Api, cch: *mut RdmaEventChannel, to: SocketAddrV4) -> (Event, *mut RdmaCmId) {
    let cli = a.resolved(cch, RDMA_PS_TCP, CLI, to);
    a.qp(cli, false);
    let p = conn_param(&[]);
    // SAFETY: a route-resolved id.
    assert_eq!(unsafe { (a.rdma_connect)(cli, &p) }, 0);
    (a.next_event(cch, false), cli)
}

#[test]
fn private_data_reaches_both_sides_and_a_reject_carries_its_reason() {
    let a = api();
    let (lch, cch) = (a.channel(), a.channel());
    let l = a.listener(lch, RDMA_PS_TCP, SocketAddrV4::new(SRV, 7401));
    let cli = a.resolved(cch, RDMA_PS_TCP, CLI, SocketAddrV4::new(SRV, 7401));
    let long = [0x5Au8; 57];
    // SAFETY: a route-resolved id; the data outlives the calls.
    unsafe {
        assert_eq!(
            (a.rdma_connect)(cli, &conn_param(&long)),
            -1,
            "57 bytes of REQ private data"
        );
        assert_eq!(errno(), libc::EINVAL);
    }
    let hello: Vec<u8> = (0..56u8).collect();
    // SAFETY: as above.
    assert_eq!(unsafe { (a.rdma_connect)(cli, &conn_param(&hello)) }, 0);
    let req = a.expect(lch, RDMA_CM_EVENT_CONNECT_REQUEST, false);
    assert_eq!(req.private, hello);
    assert_eq!(req.listen_id, l);
    let no: Vec<u8> = (0..149u32).map(|i| i as u8).collect();
    // SAFETY: a connect request's id; the data outlives the calls.
    unsafe {
        assert_eq!(
            (a.rdma_reject)(req.id, no.as_ptr() as *const c_void, 149),
            -1
        );
        assert_eq!(errno(), libc::EINVAL, "149 bytes of REJ private data");
        assert_eq!(
            (a.rdma_reject)(req.id, no.as_ptr() as *const c_void, 148),
            0
        );
    }
    let rej = a.next_event(cch, false);
    assert_eq!(
        (rej.event, rej.status),
        (RDMA_CM_EVENT_REJECTED, 28),
        "consumer-defined reject"
    );
    assert_eq!(rej.private, no[..148]);
    destroy(a, &[req.id, cli, l]);
}

#[test]
fn an_accept_carries_up_to_196_bytes_of_private_data() {
    let a = api();
    let (lch, cch) = (a.channel(), a.channel());
    let l = a.listener(lch, RDMA_PS_TCP, SocketAddrV4::new(SRV, 7411));
    let cli = a.resolved(cch, RDMA_PS_TCP, CLI, SocketAddrV4::new(SRV, 7411));
    a.qp(cli, false);
    // SAFETY: a route-resolved id.
    assert_eq!(unsafe { (a.rdma_connect)(cli, &conn_param(&[])) }, 0);
    let child = a.expect(lch, RDMA_CM_EVENT_CONNECT_REQUEST, false).id;
    a.qp(child, false);
    let answer: Vec<u8> = (0..197u32).map(|i| (i * 7) as u8).collect();
    // SAFETY: a connect request's id; the data outlives the calls.
    unsafe {
        assert_eq!(
            (a.rdma_accept)(child, &conn_param(&answer)),
            -1,
            "197 bytes of REP data"
        );
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!((a.rdma_accept)(child, &conn_param(&answer[..196])), 0);
    }
    let est = a.expect(cch, RDMA_CM_EVENT_ESTABLISHED, false);
    assert_eq!(est.private, answer[..196]);
    a.expect(lch, RDMA_CM_EVENT_ESTABLISHED, false);
    destroy(a, &[cli, child, l]);
}

#[test]
fn a_port_or_device_nobody_listens_on_is_rejected_with_invalid_service_id() {
    let a = api();
    let (lch, cch) = (a.channel(), a.channel());
    let l = a.listener(lch, RDMA_PS_TCP, SocketAddrV4::new(SRV, 7402));
    let (ev, c1) = connect_event(a, cch, SocketAddrV4::new(SRV, 7499));
    assert_eq!(
        (ev.event, ev.status),
        (RDMA_CM_EVENT_REJECTED, 8),
        "no listener on the port"
    );
    let (ev, c2) = connect_event(a, cch, SocketAddrV4::new(NOBODY, 7402));
    assert_eq!(
        (ev.event, ev.status),
        (RDMA_CM_EVENT_REJECTED, 8),
        "no CM on the device"
    );
    destroy(a, &[c1, c2, l]);
}

#[test]
fn a_request_waits_for_a_listener_that_comes_back() {
    // perftest -R closes its first listener and listens again on the port while its peer
    // already connects: the request is held until the new listener takes it.
    let a = api();
    let (lch, cch) = (a.channel(), a.channel());
    let first = a.listener(lch, RDMA_PS_TCP, SocketAddrV4::new(SRV, 7412));
    destroy(a, &[first]);
    let cli = a.resolved(cch, RDMA_PS_TCP, CLI, SocketAddrV4::new(SRV, 7412));
    a.qp(cli, false);
    let p = conn_param(&[]);
    // SAFETY: a route-resolved id.
    assert_eq!(unsafe { (a.rdma_connect)(cli, &p) }, 0);
    // SAFETY: a live channel.
    let cfd = unsafe { (*cch).fd };
    assert!(
        !readable(cfd, Duration::from_millis(50)),
        "rejected at once"
    );
    let again = a.listener(lch, RDMA_PS_TCP, SocketAddrV4::new(SRV, 7412));
    let child = a.expect(lch, RDMA_CM_EVENT_CONNECT_REQUEST, false).id;
    a.qp(child, false);
    // SAFETY: a connect request's id.
    assert_eq!(unsafe { (a.rdma_accept)(child, &p) }, 0);
    a.expect(cch, RDMA_CM_EVENT_ESTABLISHED, false);
    a.expect(lch, RDMA_CM_EVENT_ESTABLISHED, false);
    destroy(a, &[cli, child, again]);
}

#[test]
fn garbage_and_half_open_connections_leave_the_listener_working() {
    let a = api();
    let (lch, cch) = (a.channel(), a.channel());
    let l = a.listener(lch, RDMA_PS_TCP, SocketAddrV4::new(SRV, 7403));
    let mut http = cm_stream(SRV);
    http.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    assert!(
        read_to_close(&mut http).is_empty(),
        "garbage is closed without an answer"
    );
    let mut huge = cm_stream(SRV);
    huge.write_all(b"BRCM\x02\x01\xff\xff").unwrap();
    assert!(
        read_to_close(&mut huge).is_empty(),
        "an oversized body is refused"
    );
    let mut newer = cm_stream(SRV);
    newer.write_all(b"BRCM\x03\x01\x00\x00").unwrap();
    let answer = read_to_close(&mut newer);
    assert_eq!(
        answer, b"BRCM\x02\x04\x00\x03\x00\x1f\x00",
        "a newer version gets REJ 31"
    );
    let mut silent = cm_stream(SRV);
    let mut partial = cm_stream(SRV);
    partial.write_all(b"BRC").unwrap();

    // The listener still connects, disconnects and tears down while those are open.
    let (cli, child) = connected(a, lch, cch, 7403);
    // SAFETY: a connected id.
    assert_eq!(unsafe { (a.rdma_disconnect)(cli) }, 0);
    a.expect(cch, RDMA_CM_EVENT_DISCONNECTED, false);
    a.expect(lch, RDMA_CM_EVENT_DISCONNECTED, false);
    destroy(a, &[cli, child]);

    // The half-open connections are closed once the CM timeout passes.
    assert!(read_to_close(&mut silent).is_empty());
    assert!(read_to_close(&mut partial).is_empty());
    let (cli, child) = connected(a, lch, cch, 7403);
    destroy(a, &[cli, child, l]);
}

#[test]
fn a_peer_that_never_answers_is_unreachable_after_the_timeout() {
    let a = api();
    let fake = TcpListener::bind((SILENT, CM_PORT)).unwrap();
    let holder = std::thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        s.set_read_timeout(Some(EVENT_WAIT)).unwrap();
        let mut sink = Vec::new();
        // Until the client gives up (or the bound passes).
        let _ = s.read_to_end(&mut sink);
    });
    let cch = a.channel();
    let (ev, cli) = connect_event(a, cch, SocketAddrV4::new(SILENT, 7404));
    assert_eq!(
        (ev.event, ev.status),
        (RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT)
    );
    destroy(a, &[cli]);
    holder.join().unwrap();
}

#[test]
fn a_server_that_dies_mid_handshake_gives_unreachable() {
    let a = api();
    let fake = TcpListener::bind((CLOSER, CM_PORT)).unwrap();
    let closer = std::thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        s.set_read_timeout(Some(EVENT_WAIT)).unwrap();
        let mut head = [0u8; 8];
        s.read_exact(&mut head).unwrap();
        assert_eq!(&head[..6], b"BRCM\x02\x01", "the request");
    });
    let cch = a.channel();
    let (ev, cli) = connect_event(a, cch, SocketAddrV4::new(CLOSER, 7405));
    assert_eq!(
        (ev.event, ev.status),
        (RDMA_CM_EVENT_UNREACHABLE, -libc::ECONNRESET)
    );
    destroy(a, &[cli]);
    closer.join().unwrap();
}

#[test]
fn a_client_that_dies_mid_handshake_gives_unreachable() {
    let a = api();
    let lch = a.channel();
    let l = a.listener(lch, RDMA_PS_TCP, SocketAddrV4::new(SRV, 7406));
    const MRA: &[u8] = b"BRCM\x02\x02\x00\x00";

    // Gone before the application answered: the new id hears it, accepting fails.
    let mut s = cm_stream(SRV);
    s.write_all(&raw_req(7406)).unwrap();
    let mut mra = [0u8; 8];
    s.read_exact(&mut mra).unwrap();
    assert_eq!(&mra, MRA);
    let child = a.expect(lch, RDMA_CM_EVENT_CONNECT_REQUEST, false).id;
    drop(s);
    let ev = a.next_event(lch, false);
    assert_eq!(
        (ev.id, ev.event, ev.status),
        (child, RDMA_CM_EVENT_UNREACHABLE, -libc::ECONNRESET)
    );
    // SAFETY: the id of that request.
    unsafe {
        assert_eq!((a.rdma_accept)(child, core::ptr::null()), -1);
        assert_eq!(errno(), libc::ECONNRESET);
    }
    destroy(a, &[child]);

    // Gone after the REP: UNREACHABLE instead of ESTABLISHED.
    let mut s = cm_stream(SRV);
    s.write_all(&raw_req(7406)).unwrap();
    s.read_exact(&mut mra).unwrap();
    let child = a.expect(lch, RDMA_CM_EVENT_CONNECT_REQUEST, false).id;
    a.qp(child, false);
    // SAFETY: a connect request's id with a QP.
    assert_eq!(unsafe { (a.rdma_accept)(child, core::ptr::null()) }, 0);
    let mut rep = [0u8; 8];
    s.read_exact(&mut rep).unwrap();
    assert_eq!(&rep[..6], b"BRCM\x02\x03", "the REP");
    drop(s);
    let ev = a.next_event(lch, false);
    assert_eq!(
        (ev.id, ev.event, ev.status),
        (child, RDMA_CM_EVENT_UNREACHABLE, -libc::ECONNRESET)
    );
    destroy(a, &[child, l]);
}

#[test]
fn either_side_may_disconnect_and_each_hears_it_once() {
    let a = api();
    let (lch, cch) = (a.channel(), a.channel());
    let l = a.listener(lch, RDMA_PS_TCP, SocketAddrV4::new(SRV, 7407));
    let (cli, child) = connected(a, lch, cch, 7407);
    // SAFETY: connected ids; the second disconnect follows the peer's.
    unsafe {
        assert_eq!((a.rdma_disconnect)(child), 0);
        a.expect(cch, RDMA_CM_EVENT_DISCONNECTED, false);
        a.expect(lch, RDMA_CM_EVENT_DISCONNECTED, false);
        assert_eq!((a.rdma_disconnect)(cli), 0);
        assert_eq!(
            (*cli).qp.as_ref().map(|q| q.state),
            Some(IBV_QPS_ERR),
            "disconnect flushes the QP"
        );
        // SAFETY: live channels.
        let (lfd, cfd) = ((*lch).fd, (*cch).fd);
        assert!(
            !readable(lfd, Duration::from_millis(200)),
            "a second event for the server"
        );
        assert!(
            !readable(cfd, Duration::ZERO),
            "a second event for the client"
        );
    }
    destroy(a, &[cli, child, l]);
}

/// `rdma_destroy_id` waits until another thread has acknowledged the id's events, as
/// rdma-core's does: rping's CM thread prints DISCONNECTED and acknowledges it while its main
/// thread destroys the id and then the channel, and a destroy that did not wait freed the
/// id under the handler and let the main thread destroy the channel before the handler came
/// back for the next event (EINVAL, rping exits 255). An event the calling thread holds
/// cannot be acknowledged meanwhile and is not waited for.
#[test]
fn destroy_id_waits_for_another_threads_handler_to_acknowledge_the_ids_event() {
    let a = api();
    let (lch, cch) = (a.channel(), a.channel());
    let l = a.listener(lch, RDMA_PS_TCP, SocketAddrV4::new(SRV, 7414));
    let (cli, child) = connected(a, lch, cch, 7414);
    // SAFETY: a connected id.
    assert_eq!(unsafe { (a.rdma_disconnect)(child) }, 0);
    let (got, held) = std::sync::mpsc::channel();
    let ch = cch as usize;
    let handler = std::thread::spawn(move || {
        let ch = ch as *mut RdmaEventChannel;
        // SAFETY: the client's channel, live until the test ends.
        assert!(readable(unsafe { (*ch).fd }, EVENT_WAIT), "no DISCONNECTED");
        let mut ev: *mut RdmaCmEvent = core::ptr::null_mut();
        // SAFETY: a live channel; the event is ours until acknowledged.
        unsafe {
            assert_eq!((a.rdma_get_cm_event)(ch, &mut ev), 0);
            assert_eq!((*ev).event, RDMA_CM_EVENT_DISCONNECTED);
            got.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            // The handler still reads the id through the event.
            let port = (*(*ev).id).port_num;
            let acked = std::time::Instant::now();
            assert_eq!((a.rdma_ack_cm_event)(ev), 0);
            (port, acked)
        }
    });
    held.recv().unwrap();
    destroy(a, &[cli]);
    let destroyed = std::time::Instant::now();
    let (port, acked) = handler.join().unwrap();
    assert_eq!(port, 1, "the id was freed under the handler");
    assert!(
        destroyed >= acked,
        "rdma_destroy_id returned before the handler acknowledged the event"
    );
    // The server's DISCONNECTED, held by this thread: its destroy does not wait for it.
    // SAFETY: the listener's channel; the event is acknowledged after the destroy.
    unsafe {
        assert!(readable((*lch).fd, EVENT_WAIT), "no DISCONNECTED");
        let mut ev: *mut RdmaCmEvent = core::ptr::null_mut();
        assert_eq!((a.rdma_get_cm_event)(lch, &mut ev), 0);
        assert_eq!(((*ev).event, (*ev).id), (RDMA_CM_EVENT_DISCONNECTED, child));
        let start = std::time::Instant::now();
        destroy(a, &[child]);
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "rdma_destroy_id waited {:?} for the caller's own event",
            start.elapsed()
        );
        assert_eq!((a.rdma_ack_cm_event)(ev), 0);
    }
    destroy(a, &[l]);
}

#[test]
fn ud_ids_learn_the_peers_qpn_qkey_and_address() {
    let a = api();
    let (lch, cch) = (a.channel(), a.channel());
    let l = a.listener(lch, RDMA_PS_UDP, SocketAddrV4::new(SRV, 7408));
    let cli = a.resolved(cch, RDMA_PS_UDP, CLI, SocketAddrV4::new(SRV, 7408));
    a.qp(cli, true);
    let (long, hello) = ([1u8; 181], [2u8; 180]);
    // SAFETY: a route-resolved id; the data outlives the calls.
    unsafe {
        assert_eq!(
            (a.rdma_connect)(cli, &conn_param(&long)),
            -1,
            "181 bytes of SIDR REQ data"
        );
        assert_eq!((a.rdma_connect)(cli, &conn_param(&hello)), 0);
    }
    let req = a.expect(lch, RDMA_CM_EVENT_CONNECT_REQUEST, true);
    assert_eq!(req.private, hello);
    let sqp = a.qp(req.id, true);
    let answer = [3u8; 136];
    // SAFETY: a connect request's id with a UD QP.
    assert_eq!(unsafe { (a.rdma_accept)(req.id, &conn_param(&answer)) }, 0);
    let est = a.expect(cch, RDMA_CM_EVENT_ESTABLISHED, true);
    let ud = est.ud.unwrap();
    // SAFETY: a live QP.
    assert_eq!(ud.qp_num, unsafe { (*sqp).qp_num });
    assert_eq!(ud.qkey, RDMA_UDP_QKEY);
    assert_eq!((ud.ah_attr.is_global, ud.ah_attr.port_num), (1, 1));
    assert_eq!(ud.ah_attr.grh.dgid, SRV.to_ipv6_mapped().octets());
    assert_eq!(est.private, answer);
    destroy(a, &[cli, req.id, l]);
}

#[test]
fn the_channel_fd_polls_can_be_nonblocking_and_events_follow_a_migrated_id() {
    let a = api();
    let (ch1, ch2) = (a.channel(), a.channel());
    // SAFETY: live channels.
    let (fd1, fd2) = unsafe { ((*ch1).fd, (*ch2).fd) };
    // SAFETY: the channel's fd; O_NONBLOCK is the application's choice.
    unsafe {
        libc::fcntl(
            fd1,
            libc::F_SETFL,
            libc::fcntl(fd1, libc::F_GETFL) | libc::O_NONBLOCK,
        )
    };
    let mut ev = core::ptr::null_mut();
    // SAFETY: a live channel.
    unsafe {
        assert_eq!((a.rdma_get_cm_event)(ch1, &mut ev), -1);
        assert_eq!(errno(), libc::EAGAIN, "an empty non-blocking channel");
    }
    let id = a.id(ch1, RDMA_PS_TCP);
    let (s, d) = (sin(CLI, 0), sin(SRV, 7409));
    // SAFETY: a new id and valid addresses.
    let rc = unsafe { (a.rdma_resolve_addr)(id, sa(&s), sa(&d), 2000) };
    assert_eq!(rc, 0);
    assert!(
        readable(fd1, EVENT_WAIT),
        "the channel fd signals the event"
    );
    // SAFETY: the id and another live channel.
    assert_eq!(unsafe { (a.rdma_migrate_id)(id, ch2) }, 0);
    assert!(!readable(fd1, Duration::ZERO), "the event left with the id");
    // SAFETY: the id's channel is now ch2.
    assert_eq!(unsafe { (*id).channel }, ch2);
    let e = a.expect(ch2, RDMA_CM_EVENT_ADDR_RESOLVED, false);
    assert_eq!(e.id, id);
    assert!(!readable(fd2, Duration::ZERO));
    destroy(a, &[id]);
}

#[test]
fn a_destroyed_listener_rejects_the_requests_nobody_saw() {
    let a = api();
    let (lch, cch) = (a.channel(), a.channel());
    let l = a.listener(lch, RDMA_PS_TCP, SocketAddrV4::new(SRV, 7410));
    let cli = a.resolved(cch, RDMA_PS_TCP, CLI, SocketAddrV4::new(SRV, 7410));
    let p = conn_param(&[]);
    // SAFETY: a route-resolved id.
    assert_eq!(unsafe { (a.rdma_connect)(cli, &p) }, 0);
    // SAFETY: a live channel.
    let lfd = unsafe { (*lch).fd };
    assert!(readable(lfd, EVENT_WAIT), "the request arrived");
    destroy(a, &[l]);
    let ev = a.next_event(cch, false);
    assert_eq!((ev.event, ev.status), (RDMA_CM_EVENT_REJECTED, 28));
    assert!(
        !readable(lfd, Duration::ZERO),
        "the request went with its listener"
    );
    destroy(a, &[cli]);
}

#[test]
fn pointers_the_library_did_not_make_are_refused_not_followed() {
    let a = api();
    let ch = a.channel();
    let id = a.id(ch, RDMA_PS_TCP);
    let (s, d) = (sin(CLI, 0), sin(SRV, 7413));
    // SAFETY: a new id and valid addresses.
    let rc = unsafe { (a.rdma_resolve_addr)(id, sa(&s), sa(&d), 2000) };
    assert_eq!(rc, 0);
    let mut ev = core::ptr::null_mut();
    // SAFETY: a live channel with an event.
    assert_eq!(unsafe { (a.rdma_get_cm_event)(ch, &mut ev) }, 0);
    // Bytes that only look like an id, a channel or an event (a perftest retry once passed
    // a sockaddr as its id).
    let mut fake = [0x5Au8; 512];
    let bogus = fake.as_mut_ptr() as *mut c_void;
    // SAFETY: the library must refuse the bogus pointers without touching them.
    unsafe {
        assert_eq!((a.rdma_ack_cm_event)(ev), 0);
        assert_eq!((a.rdma_ack_cm_event)(ev), -1, "an event acknowledged twice");
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(
            (a.rdma_connect)(bogus as *mut RdmaCmId, core::ptr::null()),
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(
            (a.rdma_get_cm_event)(bogus as *mut RdmaEventChannel, &mut ev),
            -1
        );
        assert_eq!((a.rdma_destroy_id)(id), 0);
        assert_eq!((a.rdma_destroy_id)(id), -1, "an id destroyed twice");
        assert_eq!((a.rdma_resolve_route)(id, 2000), -1, "a destroyed id");
        let mut cid = core::ptr::null_mut();
        assert_eq!(
            (a.rdma_create_id)(bogus as *mut _, &mut cid, bogus, RDMA_PS_TCP),
            -1
        );
        (a.rdma_destroy_event_channel)(ch);
    }
    assert!(
        fake.iter().all(|&b| b == 0x5A),
        "the bogus memory was written"
    );
}

/// ECE for ids whose QP the program manages (pyverbs' external-QP flow): each side's
/// `rdma_set_local_ece` reaches the other's `rdma_get_remote_ece` through the REQ and the
/// REP; the calls refuse what rdma-core refuses.
#[test]
fn ece_options_travel_in_the_req_and_the_rep() {
    let a = api();
    let (lch, cch) = (a.channel(), a.channel());
    let l = a.listener(lch, RDMA_PS_TCP, SocketAddrV4::new(SRV, 7420));
    let cli = a.resolved(cch, RDMA_PS_TCP, CLI, SocketAddrV4::new(SRV, 7420));
    let get = |id| {
        let mut e = IbvEce {
            comp_mask: 9,
            ..IbvEce::default()
        };
        // SAFETY: a live id and a local ibv_ece.
        assert_eq!(unsafe { (a.rdma_get_remote_ece)(id, &mut e) }, 0);
        e
    };
    let mut mine = IbvEce {
        vendor_id: 0x15b3,
        options: 0x8000_0042,
        comp_mask: 0,
    };
    // SAFETY: live ids; the ibv_ece values are locals.
    unsafe {
        let mut none = IbvEce::default();
        assert_eq!((a.rdma_set_local_ece)(cli, &mut none), -1, "vendor ID 0");
        assert_eq!(errno(), libc::EINVAL);
        let mut masked = IbvEce {
            comp_mask: 1,
            ..mine
        };
        assert_eq!((a.rdma_set_local_ece)(cli, &mut masked), -1, "a comp_mask");
        assert_eq!((a.rdma_set_local_ece)(cli, core::ptr::null_mut()), -1);
        assert_eq!((a.rdma_get_remote_ece)(cli, core::ptr::null_mut()), -1);
        assert_eq!((a.rdma_set_local_ece)(cli, &mut mine), 0);
    }
    assert_eq!(get(cli), IbvEce::default(), "nothing from the peer yet");
    let mut p = conn_param(&[]);
    p.qp_num = 0x123;
    // SAFETY: a route-resolved id without a QP.
    assert_eq!(unsafe { (a.rdma_connect)(cli, &p) }, 0);
    let req = a.expect(lch, RDMA_CM_EVENT_CONNECT_REQUEST, false);
    assert_eq!(get(req.id), mine, "the REQ's ECE");
    let mut theirs = IbvEce {
        vendor_id: 0x1234,
        options: 7,
        comp_mask: 0,
    };
    p.qp_num = 0x456;
    // SAFETY: a connect request's id without a QP.
    unsafe {
        assert_eq!((a.rdma_set_local_ece)(req.id, &mut theirs), 0);
        assert_eq!((a.rdma_accept)(req.id, &p), 0);
    }
    a.expect(cch, RDMA_CM_EVENT_CONNECT_RESPONSE, false);
    assert_eq!(get(cli), theirs, "the REP's ECE");
    // SAFETY: an id that has the REP.
    assert_eq!(unsafe { (a.rdma_establish)(cli) }, 0);
    a.expect(lch, RDMA_CM_EVENT_ESTABLISHED, false);
    // An id with a QP the library made: its ECE is the QP's, not the program's.
    let other = a.resolved(cch, RDMA_PS_TCP, CLI, SocketAddrV4::new(SRV, 7420));
    a.qp(other, false);
    // SAFETY: a live id with a QP.
    unsafe {
        assert_eq!((a.rdma_set_local_ece)(other, &mut mine), -1);
        assert_eq!(errno(), libc::EINVAL);
        let mut e = IbvEce::default();
        assert_eq!((a.rdma_get_remote_ece)(other, &mut e), -1);
        assert_eq!(errno(), libc::EINVAL);
    }
    // SAFETY: connected ids of this test.
    unsafe {
        assert_eq!((a.rdma_disconnect)(cli), 0);
    }
    a.expect(cch, RDMA_CM_EVENT_DISCONNECTED, false);
    a.expect(lch, RDMA_CM_EVENT_DISCONNECTED, false);
    destroy(a, &[other, req.id, cli, l]);
}
