//! Why a device could not be opened, in a form a card owner can act on: the device, the
//! errno the verb fails with (EACCES for a missing privilege, ENODEV for a card that is not
//! there or not usable, ENOMEM for missing DMA memory, ...) and a message that names the
//! problem and its fix.

use std::fmt;

use bluerdma_core::engine::VerbsError;

/// A failed open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenError {
    /// The device (its name in the device list).
    pub device: String,
    /// The errno the verb that opened the device fails with.
    pub errno: i32,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl OpenError {
    /// An error of `device`.
    pub fn new(device: &str, errno: i32, message: impl Into<String>) -> Self {
        OpenError {
            device: device.into(),
            errno,
            message: message.into(),
        }
    }

    /// The symbolic name of [`OpenError::errno`] (`EACCES`), for messages and tests.
    pub fn errno_name(&self) -> &'static str {
        errno_name(self.errno)
    }

    /// The error of the engine's own open (its first commands) on `device`.
    pub fn from_engine(device: &str, e: VerbsError) -> Self {
        match e {
            VerbsError::CommandTimeout { .. } => OpenError::new(
                device,
                libc::ETIMEDOUT,
                format!(
                    "the card did not answer its first command ({e}): is its bitstream \
                     loaded and is it the blue-rdma card? Run `bluerdma-doctor`; a slow \
                     simulator needs a longer `command_timeout=SECS` in its device entry"
                ),
            ),
            VerbsError::OutOfResources { .. } => {
                OpenError::new(device, libc::ENOMEM, format!("opening the engine: {e}"))
            }
            VerbsError::InvalidArgument { .. } => {
                OpenError::new(device, libc::EINVAL, format!("opening the engine: {e}"))
            }
            VerbsError::Platform(p) => OpenError::new(
                device,
                match p {
                    bluerdma_core::platform::PlatformError::OutOfMemory { .. } => libc::ENOMEM,
                    bluerdma_core::platform::PlatformError::NotPermitted => libc::EACCES,
                    bluerdma_core::platform::PlatformError::Os(n) => n,
                    _ => libc::EIO,
                },
                format!("opening the engine: {e} (DMA memory for the rings; see the log)"),
            ),
            _ => OpenError::new(device, libc::EIO, format!("opening the engine: {e}")),
        }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.device, self.message)
    }
}

impl std::error::Error for OpenError {}

/// The symbolic name of an errno this crate reports.
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::ENODEV => "ENODEV",
        libc::ENOENT => "ENOENT",
        libc::ENOMEM => "ENOMEM",
        libc::EINVAL => "EINVAL",
        libc::EIO => "EIO",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EBUSY => "EBUSY",
        _ => "errno",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_that_gets_no_answer_is_a_timeout_naming_the_doctor() {
        let e = OpenError::from_engine(
            "blue0",
            VerbsError::CommandTimeout {
                op: "SetNetworkParam",
            },
        );
        assert_eq!(e.errno, libc::ETIMEDOUT);
        assert_eq!(e.errno_name(), "ETIMEDOUT");
        let text = e.to_string();
        assert!(text.starts_with("blue0: the card did not answer"), "{text}");
        assert!(text.contains("bluerdma-doctor"), "{text}");
        assert!(text.contains("command_timeout="), "{text}");
    }
}
