//! The OOB channel's shared secret ([`OobKey`]): where each device gets it, and the key
//! file this driver creates when none is configured.
//!
//! Both ends of a connection must hold the same secret; the hellos prove it
//! ([`super::auth`]). A key file holds at least [`MIN_SECRET_LEN`] bytes (surrounding
//! whitespace is ignored) and must be a regular file that only its owner, the user running
//! the driver, can read or write: a key that others can read protects nothing.
//!
//! Where the secret comes from, first match wins:
//! 1. the device's own key file (`key=PATH` in the device list, [`crate::devices`]);
//! 2. the file named by `BLUERDMA_OOB_KEY` ([`KEY_ENV`]);
//! 3. this user's default key file, created on first use with 32 random bytes in hex:
//!    `$XDG_RUNTIME_DIR/bluerdma/oob.key`, else `/run/bluerdma/oob.key` for root, else
//!    `$HOME/.local/state/bluerdma/oob.key` (the directory 0700, the file 0600).
//!
//! The default is shared by every device and process of one user on one host, so two
//! devices of one machine (and the tests) agree without configuration. Devices on two
//! hosts need the same file on both: copy it, and name it with `key=` or
//! `BLUERDMA_OOB_KEY`. An explicit path is never created: a missing file is an error.

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The environment variable that names the key file of devices without `key=`.
pub const KEY_ENV: &str = "BLUERDMA_OOB_KEY";
/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;
/// The largest key file read.
const MAX_KEY_FILE: u64 = 4096;

/// The secret bytes, and HMAC-SHA256 keyed with them; `Debug` does not show them.
#[derive(Clone)]
pub struct OobSecret {
    bytes: Arc<[u8]>,
    keyed: Hmac<Sha256>,
}

impl OobSecret {
    /// A secret of at least [`MIN_SECRET_LEN`] bytes.
    pub fn new(bytes: &[u8]) -> Result<Self, KeyError> {
        let short = || {
            KeyError::new(
                None,
                format!(
                    "the secret has {} bytes; it needs at least {MIN_SECRET_LEN}",
                    bytes.len()
                ),
            )
        };
        if bytes.len() < MIN_SECRET_LEN {
            return Err(short());
        }
        // HMAC takes a key of any length; the error cannot happen.
        let keyed = Hmac::<Sha256>::new_from_slice(bytes).map_err(|_| short())?;
        Ok(OobSecret {
            bytes: bytes.into(),
            keyed,
        })
    }

    /// HMAC-SHA256 keyed with the secret, ready for input ([`super::auth`]).
    pub(super) fn hmac(&self) -> Hmac<Sha256> {
        self.keyed.clone()
    }
}

impl PartialEq for OobSecret {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for OobSecret {}

impl fmt::Debug for OobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OobSecret({} bytes, not shown)", self.bytes.len())
    }
}

/// Where a device's OOB secret comes from (module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum OobKey {
    /// `BLUERDMA_OOB_KEY`'s file if the variable is set, else this user's default key
    /// file, created on first use.
    #[default]
    Default,
    /// This key file, which must exist.
    File(PathBuf),
    /// This secret (tests, or a caller that keeps its own).
    Secret(OobSecret),
}

impl OobKey {
    /// The secret, and where it came from (for messages: "key file /run/...").
    pub fn load(&self) -> Result<(OobSecret, String), KeyError> {
        let path = match self {
            OobKey::Secret(secret) => {
                return Ok((secret.clone(), "given in the configuration".into()))
            }
            OobKey::File(path) => return read_key_file(path).map(|s| (s, describe(path))),
            OobKey::Default => match std::env::var_os(KEY_ENV).filter(|v| !v.is_empty()) {
                Some(path) => return read_key_file(Path::new(&path)).map(|s| (s, describe(path))),
                None => default_key_path(&DefaultEnv::of_process())?,
            },
        };
        load_or_create(&path).map(|s| (s, describe(&path)))
    }
}

fn describe(path: impl AsRef<Path>) -> String {
    format!("key file {}", path.as_ref().display())
}

/// A key that cannot be used: the file (if any) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyError {
    /// The key file.
    pub path: Option<PathBuf>,
    /// What is wrong with it.
    pub problem: String,
}

impl KeyError {
    fn new(path: Option<&Path>, problem: String) -> Self {
        KeyError {
            path: path.map(Path::to_path_buf),
            problem,
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "OOB key file {}: {}", path.display(), self.problem),
            None => write!(f, "OOB key: {}", self.problem),
        }
    }
}

impl std::error::Error for KeyError {}

/// What the default key path depends on.
pub(super) struct DefaultEnv {
    pub(super) xdg_runtime_dir: Option<OsString>,
    pub(super) home: Option<OsString>,
    pub(super) euid: u32,
}

impl DefaultEnv {
    fn of_process() -> Self {
        let set = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        DefaultEnv {
            xdg_runtime_dir: set("XDG_RUNTIME_DIR"),
            home: set("HOME"),
            euid: euid(),
        }
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions, touches no memory of ours and cannot fail.
    unsafe { libc::geteuid() }
}

/// This user's default key file (module docs).
pub(super) fn default_key_path(env: &DefaultEnv) -> Result<PathBuf, KeyError> {
    let base = if let Some(dir) = &env.xdg_runtime_dir {
        PathBuf::from(dir)
    } else if env.euid == 0 {
        PathBuf::from("/run")
    } else if let Some(home) = &env.home {
        Path::new(home).join(".local/state")
    } else {
        return Err(KeyError::new(
            None,
            format!(
                "none configured and no place for the default key file (XDG_RUNTIME_DIR \
                 and HOME are unset): name a key file with `key=PATH` in the device list \
                 or {KEY_ENV}"
            ),
        ));
    };
    Ok(base.join("bluerdma").join("oob.key"))
}

/// Reads a key file, checking that only its owner (this user) can use it.
pub(super) fn read_key_file(path: &Path) -> Result<OobSecret, KeyError> {
    let fail = |problem: String| KeyError::new(Some(path), problem);
    let file = File::open(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => fail(
            "does not exist (create one with `openssl rand -hex 32 > FILE; chmod 600 FILE`, \
             the same file on both hosts)"
                .into(),
        ),
        _ => fail(format!("cannot open it: {e}")),
    })?;
    let meta = file
        .metadata()
        .map_err(|e| fail(format!("cannot stat it: {e}")))?;
    if !meta.is_file() {
        return Err(fail("is not a regular file".into()));
    }
    let me = euid();
    if meta.uid() != me {
        return Err(fail(format!(
            "is owned by uid {}, not by this user (uid {me}); a key must belong to the user \
             running the driver",
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(fail(format!(
            "others can read or write it (mode {mode:04o}); run `chmod 600 {}`",
            path.display()
        )));
    }
    let mut text = Vec::new();
    file.take(MAX_KEY_FILE + 1)
        .read_to_end(&mut text)
        .map_err(|e| fail(format!("cannot read it: {e}")))?;
    if text.len() as u64 > MAX_KEY_FILE {
        return Err(fail(format!("is longer than {MAX_KEY_FILE} bytes")));
    }
    OobSecret::new(text.trim_ascii()).map_err(|_| {
        fail(format!(
            "holds {} bytes; a key needs at least {MIN_SECRET_LEN} (this driver writes 32 \
             random bytes in hex)",
            text.trim_ascii().len()
        ))
    })
}

/// Reads the default key file, creating it (and its directory) first if it is missing.
/// Two processes creating it at once end up with the same key: the file appears
/// complete under its name (a hard link of a finished temporary file), and the second
/// process reads the first one's.
pub(super) fn load_or_create(path: &Path) -> Result<OobSecret, KeyError> {
    // Whether the file was there is asked before reading it: asked after a failed read, a
    // file another process created in between made this one report "does not exist".
    let existed = path.exists();
    match read_key_file(path) {
        Err(e) if !existed && e.path.is_some() => {}
        other => return other,
    }
    let fail = |problem: String| KeyError::new(Some(path), problem);
    let dir = path
        .parent()
        .ok_or_else(|| fail("has no directory".into()))?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| fail(format!("cannot create directory {}: {e}", dir.display())))?;
    let meta = fs::metadata(dir).map_err(|e| fail(format!("cannot stat its directory: {e}")))?;
    if meta.uid() != euid() || meta.mode() & 0o022 != 0 {
        return Err(fail(format!(
            "its directory {} belongs to uid {} with mode {:04o}; it must be this user's \
             and writable by no one else",
            dir.display(),
            meta.uid(),
            meta.mode() & 0o777
        )));
    }
    let mut random = [0u8; 32];
    getrandom::fill(&mut random).map_err(|e| fail(format!("cannot draw a random key: {e}")))?;
    let mut text: String = random.iter().map(|b| format!("{b:02x}")).collect();
    text.push('\n');
    let mut tag = [0u8; 8];
    let _ = getrandom::fill(&mut tag);
    let tmp = dir.join(format!(
        ".oob.key.{}.{:016x}",
        std::process::id(),
        u64::from_ne_bytes(tag)
    ));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()));
    let linked = written.and_then(|()| match fs::hard_link(&tmp, path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        other => other.map(|()| true),
    });
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(true) => log::info!("created the OOB key file {}", path.display()),
        Ok(false) => {}
        Err(e) => return Err(fail(format!("cannot create it: {e}"))),
    }
    read_key_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_default_path_prefers_the_runtime_dir_then_run_for_root_then_home() {
        let env = |xdg: Option<&str>, home: Option<&str>, euid| DefaultEnv {
            xdg_runtime_dir: xdg.map(Into::into),
            home: home.map(Into::into),
            euid,
        };
        let path = |e| default_key_path(&e).unwrap();
        assert_eq!(
            path(env(Some("/run/user/1000"), Some("/home/u"), 1000)),
            Path::new("/run/user/1000/bluerdma/oob.key")
        );
        assert_eq!(
            path(env(None, Some("/root"), 0)),
            Path::new("/run/bluerdma/oob.key")
        );
        assert_eq!(
            path(env(None, Some("/home/u"), 1000)),
            Path::new("/home/u/.local/state/bluerdma/oob.key")
        );
        let err = default_key_path(&env(None, None, 1000)).unwrap_err();
        assert!(err.to_string().contains("key=PATH"), "{err}");
    }

    #[test]
    fn the_default_key_file_is_created_once_owner_only_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/bluerdma/oob.key");
        let first = load_or_create(&path).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let dir_mode = fs::metadata(path.parent().unwrap()).unwrap().mode() & 0o777;
        assert_eq!(dir_mode, 0o700);
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim().len(), 64, "32 random bytes in hex: {text:?}");
        assert_eq!(load_or_create(&path).unwrap(), first);
        assert_eq!(read_key_file(&path).unwrap(), first);
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn processes_creating_the_default_at_once_get_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bluerdma/oob.key");
        let keys: Vec<OobSecret> = std::thread::scope(|s| {
            let spawned: Vec<_> = (0..4).map(|_| s.spawn(|| load_or_create(&path))).collect();
            spawned
                .into_iter()
                .map(|t| t.join().unwrap().unwrap())
                .collect()
        });
        assert!(keys.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn key_files_others_can_read_or_too_short_or_missing_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        fs::write(&path, "0123456789abcdef0123\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_key_file(&path).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("OOB key file {}", path.display())),
            "{text}"
        );
        assert!(
            text.contains("mode 0644") && text.contains("chmod 600"),
            "{text}"
        );

        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            read_key_file(&path).unwrap(),
            OobSecret::new(b"0123456789abcdef0123").unwrap()
        );
        fs::write(&path, "  short \n").unwrap();
        let err = read_key_file(&path).unwrap_err();
        assert!(err.problem.contains("holds 5 bytes"), "{err}");

        let missing = dir.path().join("missing");
        let err = OobKey::File(missing.clone()).load().unwrap_err();
        assert_eq!(err.path.as_deref(), Some(missing.as_path()));
        assert!(err.problem.contains("does not exist"), "{err}");
        assert!(!missing.exists(), "an explicit key file is never created");
    }

    #[test]
    fn a_key_file_of_another_user_is_refused() {
        if euid() != 0 {
            return; // only root can give a file away
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        fs::write(&path, "0123456789abcdef0123\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        let err = read_key_file(&path).unwrap_err();
        assert!(err.problem.contains("owned by uid 65534"), "{err}");
    }

    #[test]
    fn a_secret_shorter_than_16_bytes_is_refused_and_never_printed() {
        assert!(OobSecret::new(b"too short").is_err());
        let secret = OobSecret::new(b"sixteen bytes ok").unwrap();
        assert_eq!(format!("{secret:?}"), "OobSecret(16 bytes, not shown)");
    }
}
