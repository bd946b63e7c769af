//! Objects through their whole life on one device, through the verbs API with its progress
//! thread running: registrations that race the progress thread, memory the card cannot
//! use, and what closing a device gives back.

use bluerdma_linux::Context;
use bluerdma_sim::link::MemHub;
use bluerdma_tests::{ALL, IP0};

fn device() -> Context {
    let hub = MemHub::new();
    let spec = bluerdma_linux::DeviceSpec::new("blue0", IP0);
    Context::open_emulated(spec, Box::new(hub.attach(IP0).unwrap())).unwrap()
}

/// The progress thread moves a registration on while the caller polls it too; whoever
/// finishes it, the caller gets its key (the caller used to see "no command with handle"
/// when the progress thread had collected the last response first).
#[test]
fn registrations_racing_the_progress_thread_all_succeed() {
    let ctx = device();
    let pd = ctx.alloc_pd().unwrap();
    for i in 0..400 {
        let mr = pd
            .alloc_mr(4096, ALL)
            .unwrap_or_else(|e| panic!("registration {i}: {e}"));
        assert_eq!(mr.len(), 4096);
    }
}
