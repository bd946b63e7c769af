//! Memory and QP access flags as descriptors carry them: the low 8 bits of
//! `ibv_access_flags` (layout-verification.md 1.2: UpdateMrTable acc_flags, ManageQp
//! rq_access_flags; the RTL's `MemAccessTypeFlag`).

bitflags::bitflags! {
    /// The low 8 bits of `ibv_access_flags`. Bits without a name are kept as read
    /// (`from_bits_retain`), so decoding and re-encoding never loses them.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u8 {
        /// IBV_ACCESS_LOCAL_WRITE.
        const LOCAL_WRITE = 1;
        /// IBV_ACCESS_REMOTE_WRITE.
        const REMOTE_WRITE = 2;
        /// IBV_ACCESS_REMOTE_READ.
        const REMOTE_READ = 4;
        /// IBV_ACCESS_REMOTE_ATOMIC.
        const REMOTE_ATOMIC = 8;
        /// IBV_ACCESS_MW_BIND.
        const MW_BIND = 16;
        /// IBV_ACCESS_ZERO_BASED.
        const ZERO_BASED = 32;
        /// IBV_ACCESS_ON_DEMAND.
        const ON_DEMAND = 64;
        /// IBV_ACCESS_HUGETLB.
        const HUGETLB = 128;
    }
}
