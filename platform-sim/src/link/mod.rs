//! The link between emulated NICs: Ethernet frames carried over UDP between cards addressed
//! by IP (many cards on one host with 127.0.0.x addresses), with optional pcap capture and
//! seeded fault injection. Filled in by issue B's link work.

use std::io;
use std::time::Duration;

/// One card's port on the link.
pub trait LinkPort: Send {
    /// Transmits Ethernet frames (destination MAC first, no FCS), in order.
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()>;
    /// Receives frames for this card, calling `on_frame` for each, waiting at most `timeout`
    /// for the first one. Returns how many frames were delivered.
    fn recv_frames(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize>;
}
