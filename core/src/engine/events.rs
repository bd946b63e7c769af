//! Asynchronous events: what the device tells the application outside the completion
//! queues (ibv_get_async_event): a CQ that overran, a QP that went to ERR on its own.

use crate::keys::Qpn;

use super::{Device, Platform, Storage};

/// Events kept until taken; beyond that the oldest are kept and later ones counted.
pub(crate) const EVENT_QUEUE: usize = 64;

/// An asynchronous event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The CQ overran: a completion found it full and was lost (IBV_EVENT_CQ_ERR). Its QPs
    /// went to ERR.
    CqError {
        /// The CQ's handle.
        cq: u32,
    },
    /// The QP went to ERR without the application asking (IBV_EVENT_QP_FATAL): its CQ
    /// overran, or its peer's out-of-band connection was lost.
    QpFatal {
        /// The QP.
        qpn: Qpn,
    },
}

/// The events not taken yet.
#[derive(Clone, Debug, Default)]
pub(crate) struct Events {
    queue: heapless::Deque<AsyncEvent, EVENT_QUEUE>,
    /// Events lost because the queue was full.
    pub(crate) lost: u64,
}

impl Events {
    pub(crate) fn raise(&mut self, e: AsyncEvent) {
        if self.queue.push_back(e).is_err() {
            self.lost += 1;
            core_error!("asynchronous event lost (queue of {} full)", EVENT_QUEUE);
        }
    }
}

impl<P: Platform, S: Storage> Device<P, S> {
    /// The oldest asynchronous event not taken yet.
    pub fn take_event(&mut self) -> Option<AsyncEvent> {
        self.events.queue.pop_front()
    }
}
