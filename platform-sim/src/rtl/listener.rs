//! The accept loop of the card-side servers, stoppable from another thread.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use super::connect::loopback;

/// How often a stopped flag is noticed while no client connects.
const POLL: Duration = Duration::from_millis(5);

/// Binds 127.0.0.1:`port` (0 picks a free port). std sets SO_REUSEADDR on Unix, so a port
/// left in TIME_WAIT by a previous run can be bound again at once.
pub(crate) fn bind_loopback(port: u16) -> io::Result<TcpListener> {
    TcpListener::bind(loopback(port))
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on 127.0.0.1:{port}: {e}")))
}

/// Accepts connections until `stop` is set or `on_client` breaks, handing each one to
/// `on_client` as a blocking stream with TCP_NODELAY set.
pub(crate) fn accept_loop(
    listener: &TcpListener,
    stop: &AtomicBool,
    mut on_client: impl FnMut(TcpStream) -> ControlFlow<()>,
) {
    if let Err(e) = listener.set_nonblocking(true) {
        log::error!("cannot poll the listener: {e}");
        return;
    }
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let ready = stream
                    .set_nonblocking(false)
                    .and_then(|()| stream.set_nodelay(true));
                if let Err(e) = ready {
                    log::warn!("dropping connection from {peer}: {e}");
                    continue;
                }
                if on_client(stream).is_break() {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(POLL),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // ECONNABORTED and friends concern one client only.
                log::warn!("accept failed: {e}");
                thread::sleep(POLL);
            }
        }
    }
}
