//! The command queue: commands go out on the command-request ring and complete when the
//! card's response with the same `user_data` tag comes back on the response ring. Submit,
//! then complete on a later [`CommandQueue::poll`]; [`CommandQueue::wait`] is the blocking
//! helper for callers that want one. Several commands may be in flight (one per tag), and a
//! response is matched to its own command whatever the order; a command the card never
//! answers (an unknown op code is never answered: correction 4) times out on its own.
//!
//! The same queue serves the engine and the raw-ring driver of platform-sim.

use crate::desc::cmd::{CmdRequest, CmdResponse};
use crate::platform::RegisterAccess;
use crate::ring::{ConsumerRing, Popped, ProducerRing};
use crate::time::{Instant, Nanos};

use super::error::VerbsError;

/// A submitted command, to ask about later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    tag: u8,
    seq: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Slot {
    #[default]
    Free,
    InFlight {
        seq: u32,
        op: &'static str,
        deadline: Instant,
    },
    Done {
        seq: u32,
        op: &'static str,
        ok: bool,
    },
    /// Its caller gave up (timed out); a late response frees the tag.
    Abandoned,
}

/// The command rings and the commands in flight.
pub struct CommandQueue {
    req: ProducerRing,
    resp: ConsumerRing,
    slots: [Slot; 256],
    next_tag: u8,
    seq: u32,
    timeout: Nanos,
    /// Responses that matched no command in flight, or did not decode.
    pub stray_responses: u64,
    /// Commands submitted.
    pub submitted: u64,
}

/// The name of a command, for errors.
pub fn op_name(req: &CmdRequest) -> &'static str {
    match req {
        CmdRequest::UpdateMrTable(_) => "UpdateMrTable",
        CmdRequest::UpdatePgt(_) => "UpdatePgt",
        CmdRequest::ManageQp(_) => "ManageQp",
        CmdRequest::SetNetworkParam(_) => "SetNetworkParam",
        CmdRequest::SetRawPacketReceiveMeta(_) => "SetRawPacketReceiveMeta",
    }
}

impl CommandQueue {
    /// A queue over the (programmed) command rings; each command may take `timeout`.
    pub fn new(req: ProducerRing, resp: ConsumerRing, timeout: Nanos) -> Self {
        CommandQueue {
            req,
            resp,
            slots: [Slot::Free; 256],
            next_tag: 0,
            seq: 0,
            timeout,
            stray_responses: 0,
            submitted: 0,
        }
    }

    /// Puts `req` on the ring. Busy when every tag is in flight or the ring is full.
    pub fn submit(
        &mut self,
        regs: &impl RegisterAccess,
        req: CmdRequest,
        now: Instant,
    ) -> Result<Ticket, VerbsError> {
        let busy = VerbsError::Busy {
            what: "command queue",
        };
        let tag = (0..=255u8)
            .map(|k| self.next_tag.wrapping_add(k))
            .find(|t| self.slots[*t as usize] == Slot::Free)
            .ok_or(busy)?;
        self.req
            .push_batch(regs, &[req.encode(tag)])
            .map_err(|_| busy)?;
        self.seq = self.seq.wrapping_add(1);
        self.slots[tag as usize] = Slot::InFlight {
            seq: self.seq,
            op: op_name(&req),
            deadline: now + self.timeout,
        };
        self.next_tag = tag.wrapping_add(1);
        self.submitted += 1;
        Ok(Ticket { tag, seq: self.seq })
    }

    /// Takes the card's responses off the ring; returns whether any came.
    pub fn poll(&mut self, regs: &impl RegisterAccess) -> bool {
        let mut any = false;
        while let Some(p) = self.resp.pop() {
            any = true;
            let Popped::One(d) = p else {
                self.stray_responses += 1;
                continue;
            };
            match CmdResponse::decode(&d) {
                Ok(r) => {
                    let slot = &mut self.slots[r.user_data as usize];
                    match *slot {
                        Slot::InFlight { seq, op, .. } => {
                            *slot = Slot::Done {
                                seq,
                                op,
                                ok: r.is_success,
                            }
                        }
                        Slot::Abandoned => *slot = Slot::Free,
                        _ => {
                            self.stray_responses += 1;
                            core_warn!("command response with tag {} ignored", r.user_data);
                        }
                    }
                }
                Err(e) => {
                    self.stray_responses += 1;
                    core_error!("bad command response: {}", e);
                }
            }
        }
        if any {
            self.resp.sync_tail(regs);
        }
        any
    }

    /// How `t` ended, once it has (and forgets it): `None` while in flight. A command past
    /// its deadline ends in CommandTimeout.
    pub fn check(&mut self, t: Ticket, now: Instant) -> Option<Result<(), VerbsError>> {
        let slot = &mut self.slots[t.tag as usize];
        match *slot {
            Slot::Done { seq, op, ok } if seq == t.seq => {
                *slot = Slot::Free;
                Some(if ok {
                    Ok(())
                } else {
                    Err(VerbsError::CommandFailed { op })
                })
            }
            Slot::InFlight { seq, op, deadline } if seq == t.seq => {
                if now < deadline {
                    return None;
                }
                *slot = Slot::Abandoned;
                Some(Err(VerbsError::CommandTimeout { op }))
            }
            _ => Some(Err(VerbsError::NoSuchObject {
                what: "command",
                handle: t.seq,
            })),
        }
    }

    /// Gives up on `t` without waiting: a response that comes later frees its tag.
    pub fn forget(&mut self, t: Ticket) {
        let slot = &mut self.slots[t.tag as usize];
        match *slot {
            Slot::InFlight { seq, .. } if seq == t.seq => *slot = Slot::Abandoned,
            Slot::Done { seq, .. } if seq == t.seq => *slot = Slot::Free,
            _ => {}
        }
    }

    /// Submits `req` and waits for its response (the blocking helper): `clock` is read
    /// between polls of the response ring.
    pub fn run(
        &mut self,
        regs: &impl RegisterAccess,
        req: CmdRequest,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        let t = self.submit(regs, req, clock())?;
        self.wait(regs, t, clock)
    }

    /// Waits for `t` (the blocking helper).
    pub fn wait(
        &mut self,
        regs: &impl RegisterAccess,
        t: Ticket,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        loop {
            // The time is read before the ring: a response there by then is in time.
            let now = clock();
            self.poll(regs);
            if let Some(r) = self.check(t, now) {
                return r;
            }
            core::hint::spin_loop();
        }
    }

    /// How long each command submitted from now on may take.
    pub fn set_timeout(&mut self, timeout: Nanos) {
        self.timeout = timeout;
    }

    /// Commands submitted and not ended.
    pub fn in_flight(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s, Slot::InFlight { .. }))
            .count()
    }

    /// The request ring (for dumps).
    pub fn request_ring(&self) -> &ProducerRing {
        &self.req
    }

    /// The response ring (for dumps).
    pub fn response_ring(&self) -> &ConsumerRing {
        &self.resp
    }

    /// Pushes a raw descriptor on the request ring, outside the bookkeeping (contract tests
    /// send malformed requests this way).
    pub fn push_raw(
        &mut self,
        regs: &impl RegisterAccess,
        d: &crate::desc::RawDesc,
    ) -> Result<(), VerbsError> {
        self.req
            .push_batch(regs, &[*d])
            .map_err(|_| VerbsError::Busy {
                what: "command ring",
            })
    }

    /// The rings back (to free their memory).
    pub fn into_rings(self) -> (ProducerRing, ConsumerRing) {
        (self.req, self.resp)
    }
}
