//! The verbs that name enum values (`ibv_wc_status_str`, `ibv_node_type_str`,
//! `ibv_port_state_str`, `ibv_event_type_str`) and convert static rates (`ibv_rate_to_mult`,
//! `ibv_rate_to_mbps` and back): pure functions of their argument, with the strings and
//! tables of verbs.h.

use core::ffi::{c_char, c_int};

fn cstr(s: &'static std::ffi::CStr) -> *const c_char {
    s.as_ptr()
}

#[no_mangle]
pub extern "C" fn bv_ibv_wc_status_str(status: u32) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 23] = [
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
    ];
    NAMES
        .get(status as usize)
        .map_or(cstr(c"unknown"), |s| s.as_ptr())
}

#[no_mangle]
pub extern "C" fn bv_ibv_node_type_str(t: c_int) -> *const c_char {
    match t {
        1 => cstr(c"InfiniBand channel adapter"),
        2 => cstr(c"InfiniBand switch"),
        3 => cstr(c"InfiniBand router"),
        4 => cstr(c"iWARP NIC"),
        5 => cstr(c"usNIC"),
        6 => cstr(c"usNIC UDP"),
        7 => cstr(c"unspecified"),
        _ => cstr(c"unknown"),
    }
}

#[no_mangle]
pub extern "C" fn bv_ibv_port_state_str(s: u32) -> *const c_char {
    match s {
        0 => cstr(c"PORT_NOP"),
        1 => cstr(c"PORT_DOWN"),
        2 => cstr(c"PORT_INIT"),
        3 => cstr(c"PORT_ARMED"),
        4 => cstr(c"PORT_ACTIVE"),
        5 => cstr(c"PORT_ACTIVE_DEFER"),
        _ => cstr(c"invalid state"),
    }
}

#[no_mangle]
pub extern "C" fn bv_ibv_event_type_str(e: u32) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 22] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
        c"unknown",
        c"unknown",
    ];
    NAMES
        .get(e as usize)
        .map_or(cstr(c"unknown"), |s| s.as_ptr())
}

/// `ibv_rate` -> multiple of 2.5 Gb/s, and back (IBTA static rate encoding).
const RATES: [(c_int, c_int, c_int); 18] = [
    // (ibv_rate, mult of 2.5 Gb/s, Mb/s)
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, 6, 14062),
    (12, 22, 56250),
    (13, 45, 112500),
    (14, 67, 168750),
    (15, 10, 25781),
    (16, 40, 103125),
    (17, 80, 206250),
    (18, 120, 309375),
    (19, 160, 412500),
];

#[no_mangle]
pub extern "C" fn bv_ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

#[no_mangle]
pub extern "C" fn bv_mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES.iter().find(|r| r.1 == mult).map_or(0, |r| r.0)
}

#[no_mangle]
pub extern "C" fn bv_ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

#[no_mangle]
pub extern "C" fn bv_mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
}
