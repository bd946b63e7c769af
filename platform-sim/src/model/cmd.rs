//! Command processing (nic-behaviour.md section 5, review correction 2): one command at a
//! time, in ring order, each answered on the response ring.
//!
//! Op codes decode from their low 3 bits (8..=12 alias 0..=4); 5..=7 get no response, as on
//! the card, and are counted. Both they and a request the RTL cannot execute (a PGT staging
//! buffer that breaks the DMA rules, a DMA fault) end the RTL's simulation: they are RTL
//! stops ([`super::stops`]). A card that freezes at them answers nothing more; one that
//! carries on answers the failed UpdatePGT with is_success = 0, so the driver's command
//! wait ends with an error.

use bluerdma_core::addr::DeviceAddr;
use bluerdma_core::desc::cmd::{CmdRequest, CmdResponse};
use bluerdma_core::desc::pgt::{check_staging, staged_entries, PGT_ENTRY_SIZE};
use bluerdma_core::desc::{DescError, RawDesc};

use super::card::{CardState, Shared};
use super::stats::NicStats;
use super::stops::RtlStop;
use super::tables::MrEntry;
use crate::mem::DmaPort;

/// Executes one command request; returns the response to write, or `None` when the card
/// does not answer (unknown op code, or an RTL stop froze the card).
pub fn execute(
    shared: &Shared,
    state: &mut CardState,
    dma: &mut dyn DmaPort,
    request: &RawDesc,
) -> Option<RawDesc> {
    let stats = &shared.stats;
    let (cmd, _user_data) = match CmdRequest::decode(request) {
        Ok(c) => c,
        Err(e) => {
            NicStats::bump(&stats.command_errors);
            if let DescError::UnknownOpCode { raw, .. } = e {
                shared.rtl_stop_at(RtlStop::UnknownCommand { op: raw & 7 });
            } else {
                log::error!(
                    "{}: command not executed, no response (as the card): {e}",
                    shared.config.name
                );
            }
            return None;
        }
    };
    NicStats::bump(&stats.commands);
    let mut response = CmdResponse::header_only(request);
    match cmd {
        CmdRequest::UpdateMrTable(c) => {
            let entry = state.tables.mr_mut(c.mr_key.index());
            *entry = if c.mr_length == 0 {
                MrEntry::default()
            } else {
                MrEntry {
                    valid: true,
                    base_va: c.mr_base_va.0,
                    length: c.mr_length,
                    acc_flags: c.acc_flags.bits(),
                    pgt_offset: c.pgt_offset,
                    key: c.mr_key.key(),
                    pd: c.pd,
                }
            };
        }
        CmdRequest::UpdatePgt(c) => {
            if let Err(reason) = update_pgt(state, dma, c.dma_addr, c.start_index, c.entry_count) {
                NicStats::bump(&stats.command_errors);
                if shared.rtl_stop_at(RtlStop::UpdatePgt { reason }) {
                    return None;
                }
                response.is_success = false;
            }
        }
        CmdRequest::ManageQp(c) => {
            let index = c.qpn.index();
            let ctx = state.tables.qp_mut(index);
            ctx.valid = c.is_valid;
            ctx.key = c.qpn.key();
            ctx.qp_type = c.qp_type.to_ibv() as u8;
            ctx.rq_access_flags = c.rq_access_flags.bits();
            ctx.pmtu = Some(c.pmtu);
            ctx.peer_qpn = c.peer_qpn.get();
            ctx.peer_mac = c.peer_mac.to_bits();
            ctx.peer_ip = u32::from(c.peer_ip);
            ctx.local_udp_port = c.local_udp_port;
            if let Some(pd) = state.qp_pd.get_mut(index as usize) {
                *pd = c.pd;
            }
            // Every ManageQp resets the QP's ACK tracking (correction 5).
            state.reset_window(index);
            response = CmdResponse::echo(request);
        }
        CmdRequest::SetNetworkParam(c) => state.net = Some(c),
        CmdRequest::SetRawPacketReceiveMeta(c) => {
            // The RTL drops this address (nic-behaviour.md 5.5); the model honours it.
            state.raw_rx_base = Some(c.write_base_addr);
            state.raw_rx_slot = 0;
        }
    }
    Some(response.encode())
}

fn update_pgt(
    state: &mut CardState,
    dma: &mut dyn DmaPort,
    dma_addr: DeviceAddr,
    start_index: u32,
    entry_count: u32,
) -> Result<(), String> {
    check_staging(dma_addr, entry_count).map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64 * PGT_ENTRY_SIZE];
    let bytes = &mut buf[..entry_count as usize * PGT_ENTRY_SIZE];
    dma.read(dma_addr, bytes).map_err(|e| e.to_string())?;
    let entries = staged_entries(bytes, entry_count).map_err(|e| e.to_string())?;
    for (j, e) in entries.enumerate() {
        state
            .tables
            .set_pgt(start_index.wrapping_add(j as u32), e.0 .0);
    }
    Ok(())
}
