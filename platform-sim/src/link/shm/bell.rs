//! The bell of a card on the shared-memory link: a Unix datagram socket named after the
//! card's address, which announces the card to the others on the host, carries the rings
//! they pass it, and wakes it when it sleeps.
//!
//! A card at `ip` on link port `port` binds `<dir>/net-<netns>-<uid>/<ip>:<port>.bell`,
//! where `<dir>` is `/dev/shm/bluerdma-link` by default, `<netns>` the inode of the
//! process's network namespace (cards in two namespaces may share addresses; they never
//! share a bell) and `<uid>` the user's (the directory is theirs alone). The owner of the card's UDP address is the only one that binds it, so a stale
//! socket file left by a process that died is replaced without asking.
//!
//! Messages (version 1; a message that breaks a rule is dropped whole, its descriptors
//! closed):
//!
//! | Bytes | Field |
//! |---|---|
//! | 0..4 | magic `BLSM` |
//! | 4 | version, 1 |
//! | 5 | kind: 1 wake, 2 probe, 3 attach |
//! | 6..8 | reserved, 0 |
//! | 8..12 | attach only: the sending card's IPv4 address |
//! | 12..16 | attach only: reserved, 0 |
//! | 16..24 | attach only: the ring's nonce (little-endian) |
//!
//! Wake and probe are 8 bytes and carry no descriptor; attach is 24 bytes and carries
//! exactly one, the ring's memfd (`SCM_RIGHTS`). A probe only tells its sender whether
//! anyone still listens: sending to a socket whose owner has gone fails.

use std::fmt;
use std::io;
use std::mem;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::ptr;

/// First four bytes of every message.
pub const MAGIC: [u8; 4] = *b"BLSM";
/// The message version this code writes and reads.
pub const VERSION: u8 = 1;
/// Length of a wake or probe message.
pub const SHORT_LEN: usize = 8;
/// Length of an attach message.
pub const ATTACH_LEN: usize = 24;

/// One message on a bell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BellMsg {
    /// Frames wait in a ring for the bell's owner.
    Wake,
    /// Nothing: the sender checks that the owner is alive.
    Probe,
    /// A ring from the card at `src` (its memfd travels with the message).
    Attach {
        /// The sending card.
        src: Ipv4Addr,
        /// The ring's nonce, also in its header.
        nonce: u64,
    },
}

/// Why a message was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BellError {
    /// Not the length of its kind (or longer than any message); the length is given.
    BadLength(usize),
    /// The first four bytes are not [`MAGIC`].
    BadMagic,
    /// A version this code does not read.
    UnknownVersion(u8),
    /// An unknown kind.
    UnknownKind(u8),
    /// Reserved bytes are not zero.
    Reserved,
    /// The message carries the wrong number of descriptors (given) for its kind.
    Descriptors(usize),
}

impl fmt::Display for BellError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadLength(n) => write!(f, "bell message of {n} bytes has the wrong length"),
            Self::BadMagic => write!(f, "bell message with a bad magic"),
            Self::UnknownVersion(v) => write!(f, "bell message of unknown version {v}"),
            Self::UnknownKind(k) => write!(f, "bell message of unknown kind {k}"),
            Self::Reserved => write!(f, "bell message with reserved bytes set"),
            Self::Descriptors(n) => write!(f, "bell message with {n} descriptors"),
        }
    }
}

impl std::error::Error for BellError {}

const KIND_WAKE: u8 = 1;
const KIND_PROBE: u8 = 2;
const KIND_ATTACH: u8 = 3;

impl BellMsg {
    /// The message's bytes.
    pub fn encode(&self) -> ([u8; ATTACH_LEN], usize) {
        let mut b = [0u8; ATTACH_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        match *self {
            BellMsg::Wake => b[5] = KIND_WAKE,
            BellMsg::Probe => b[5] = KIND_PROBE,
            BellMsg::Attach { src, nonce } => {
                b[5] = KIND_ATTACH;
                b[8..12].copy_from_slice(&src.octets());
                b[16..24].copy_from_slice(&nonce.to_le_bytes());
                return (b, ATTACH_LEN);
            }
        }
        (b, SHORT_LEN)
    }

    /// Checks a received message that carried `fds` descriptors.
    pub fn parse(bytes: &[u8], fds: usize) -> Result<BellMsg, BellError> {
        let header = bytes
            .get(..SHORT_LEN)
            .ok_or(BellError::BadLength(bytes.len()))?;
        if header[..4] != MAGIC {
            return Err(BellError::BadMagic);
        }
        if header[4] != VERSION {
            return Err(BellError::UnknownVersion(header[4]));
        }
        if header[6..8] != [0, 0] {
            return Err(BellError::Reserved);
        }
        let (msg, len, want_fds) = match header[5] {
            KIND_WAKE => (BellMsg::Wake, SHORT_LEN, 0),
            KIND_PROBE => (BellMsg::Probe, SHORT_LEN, 0),
            KIND_ATTACH => {
                let body = bytes
                    .get(8..ATTACH_LEN)
                    .ok_or(BellError::BadLength(bytes.len()))?;
                if body[4..8] != [0; 4] {
                    return Err(BellError::Reserved);
                }
                let src = Ipv4Addr::new(body[0], body[1], body[2], body[3]);
                let mut nonce = [0u8; 8];
                nonce.copy_from_slice(&body[8..16]);
                let nonce = u64::from_le_bytes(nonce);
                (BellMsg::Attach { src, nonce }, ATTACH_LEN, 1)
            }
            k => return Err(BellError::UnknownKind(k)),
        };
        if bytes.len() != len {
            return Err(BellError::BadLength(bytes.len()));
        }
        if fds != want_fds {
            return Err(BellError::Descriptors(fds));
        }
        Ok(msg)
    }
}

/// The directory of this user's bells in this network namespace under `base`
/// (`base/net-<netns inode>-<uid>`, mode 0700), created if missing. A `base` this call
/// creates is made writable by every user, sticky, like `/tmp`, so that each user gets a
/// directory of their own in it.
pub fn namespace_dir(base: &Path) -> io::Result<PathBuf> {
    let netns = std::fs::metadata("/proc/self/ns/net")?.ino();
    let uid = std::fs::metadata("/proc/self")?.uid();
    if !base.exists() {
        std::fs::DirBuilder::new().recursive(true).create(base)?;
        // Another user's process may have created it meanwhile; then its mode stays theirs.
        let _ = std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o1777));
    }
    let dir = base.join(format!("net-{netns}-{uid}"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    Ok(dir)
}

/// The bell of the card at `ip` on port `port`, in `dir` (from [`namespace_dir`]).
pub fn bell_path(dir: &Path, ip: Ipv4Addr, port: u16) -> PathBuf {
    dir.join(format!("{ip}:{port}.bell"))
}

/// A card's own bell, bound; unlinked when dropped.
pub struct Bell {
    sock: UnixDatagram,
    path: PathBuf,
    /// The socket file's inode, so that drop removes only our own.
    ino: u64,
}

impl fmt::Debug for Bell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bell").field("path", &self.path).finish()
    }
}

impl Bell {
    /// Binds `path`, replacing a stale socket there (a file of another kind is an error).
    pub fn bind(path: &Path) -> io::Result<Self> {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", path.display()),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let sock = UnixDatagram::bind(path)?;
        sock.set_nonblocking(true)?;
        let ino = std::fs::symlink_metadata(path)?.ino();
        Ok(Self {
            sock,
            path: path.to_owned(),
            ino,
        })
    }

    /// The socket file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes one message without waiting: `Ok(None)` if none is queued. The descriptors it
    /// carried are in `fds` (emptied first), the bytes in `buf`; returns the byte count,
    /// or `usize::MAX` for a message cut short (longer than `buf` or with too many
    /// descriptors), which is never valid.
    pub fn recv(&self, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<Option<usize>> {
        fds.clear();
        recv_with_fds(self.sock.as_fd(), buf, fds)
    }
}

impl AsFd for Bell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A socket connected to another card's bell: it reaches that card's process only, and a
/// send fails once that process has gone (a new owner of the same path is another socket).
pub struct PeerBell {
    sock: UnixDatagram,
}

impl fmt::Debug for PeerBell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerBell").finish_non_exhaustive()
    }
}

impl PeerBell {
    /// Connects to the bell at `path`: fails (`NotFound`, `ConnectionRefused`) if no card
    /// listens there.
    pub fn connect(path: &Path) -> io::Result<Self> {
        let sock = UnixDatagram::unbound()?;
        sock.connect(path)?;
        Ok(Self { sock })
    }

    /// Sends `msg` (with `fd` for an attach) without waiting. A full queue at the peer is
    /// not an error for a wake or a probe (the peer has messages to wake it); any other
    /// failure means the peer has gone or the ring did not reach it.
    pub fn send(&self, msg: BellMsg, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let (bytes, len) = msg.encode();
        match send_with_fd(self.sock.as_fd(), &bytes[..len], fd) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && fd.is_none() => Ok(()),
            other => other,
        }
    }
}

/// Room for the control message of a received message: 64 bytes, a `cmsghdr` and up to 12
/// descriptors (a message with more is cut short; every descriptor received is closed
/// unless the message is a valid attach, which keeps its one), in u64s for `cmsghdr`'s
/// alignment.
const CONTROL_WORDS: usize = 8;

fn send_with_fd(sock: BorrowedFd<'_>, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let mut control = [0u64; CONTROL_WORDS];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is a plain C struct; all-zero is a valid (empty) value.
    let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    if let Some(fd) = fd {
        let raw: RawFd = fd.as_raw_fd();
        // SAFETY: CMSG_SPACE is arithmetic on a constant.
        let space = unsafe { libc::CMSG_SPACE(mem::size_of::<RawFd>() as u32) } as usize;
        hdr.msg_control = control.as_mut_ptr().cast();
        hdr.msg_controllen = space as _;
        // SAFETY: msg_control points at `control`, 64 bytes and 8-aligned, of which the
        // first `space` (24) bytes are one cmsghdr and one descriptor: CMSG_FIRSTHDR is
        // non-null and every write stays inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&hdr);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(mem::size_of::<RawFd>() as u32) as _;
            ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), raw);
        }
    }
    loop {
        // SAFETY: `hdr` points at `iov` (over `bytes`) and `control`, all alive for the
        // call, which only reads them; the descriptor in it is open (borrowed).
        let n = unsafe {
            libc::sendmsg(
                sock.as_raw_fd(),
                &hdr,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<Option<usize>> {
    let mut control = [0u64; CONTROL_WORDS];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is a plain C struct; all-zero is a valid (empty) value.
    let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = control.as_mut_ptr().cast();
    hdr.msg_controllen = mem::size_of_val(&control) as _;
    let n = loop {
        // SAFETY: `hdr` points at `iov` (over `buf`) and `control`, both borrowed mutably
        // for the call; the kernel writes at most iov_len and msg_controllen bytes.
        let n = unsafe {
            libc::recvmsg(
                sock.as_raw_fd(),
                &mut hdr,
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            )
        };
        if n >= 0 {
            break n as usize;
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(err),
        }
    };
    // SAFETY: the kernel filled `hdr`: msg_control still points at `control` and
    // msg_controllen is what it wrote, so the CMSG_* walk stays inside `control`; each
    // SCM_RIGHTS descriptor is a new one installed for us, which we take ownership of.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&hdr);
        while !cmsg.is_null() {
            let c = &*cmsg;
            if c.cmsg_level == libc::SOL_SOCKET && c.cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let header = data.offset_from(cmsg.cast::<u8>()) as usize;
                let count = (c.cmsg_len as usize).saturating_sub(header) / mem::size_of::<RawFd>();
                for i in 0..count {
                    let raw = ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    if raw >= 0 {
                        fds.push(OwnedFd::from_raw_fd(raw));
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&hdr, cmsg);
        }
    }
    let cut = hdr.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
    Ok(Some(if cut { usize::MAX } else { n }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_encode_to_the_documented_bytes_and_back() {
        let msg = BellMsg::Attach {
            src: Ipv4Addr::new(127, 0, 0, 2),
            nonce: 0x0102_0304_0506_0708,
        };
        let (b, len) = msg.encode();
        assert_eq!(
            &b[..len],
            &[
                b'B', b'L', b'S', b'M', 1, 3, 0, 0, 127, 0, 0, 2, 0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2,
                1
            ]
        );
        assert_eq!(BellMsg::parse(&b[..len], 1), Ok(msg));
        assert_eq!(BellMsg::parse(&b[..len], 0), Err(BellError::Descriptors(0)));
        let (w, len) = BellMsg::Wake.encode();
        assert_eq!(&w[..len], b"BLSM\x01\x01\x00\x00");
        assert_eq!(BellMsg::parse(&w[..len], 0), Ok(BellMsg::Wake));
        assert_eq!(BellMsg::parse(&w[..9], 0), Err(BellError::BadLength(9)));
        assert_eq!(BellMsg::parse(&w[..5], 0), Err(BellError::BadLength(5)));
        let mut bad = w;
        bad[5] = 9;
        assert_eq!(BellMsg::parse(&bad[..8], 0), Err(BellError::UnknownKind(9)));
        bad[5] = 1;
        bad[7] = 1;
        assert_eq!(BellMsg::parse(&bad[..8], 0), Err(BellError::Reserved));
    }

    #[test]
    fn a_ring_descriptor_travels_and_a_gone_peer_is_noticed() {
        let dir = std::env::temp_dir().join(format!("bluerdma-bell-{}", std::process::id()));
        let dir = namespace_dir(&dir).unwrap();
        let path = bell_path(&dir, Ipv4Addr::new(127, 0, 0, 9), 1);
        let bell = Bell::bind(&path).unwrap();
        let peer = PeerBell::connect(&path).unwrap();
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let msg = BellMsg::Attach {
            src: Ipv4Addr::LOCALHOST,
            nonce: 5,
        };
        peer.send(msg, Some(file.as_fd())).unwrap();
        let (mut buf, mut fds) = ([0u8; 64], Vec::new());
        let n = bell.recv(&mut buf, &mut fds).unwrap().unwrap();
        assert_eq!(BellMsg::parse(&buf[..n], fds.len()), Ok(msg));
        assert_eq!(bell.recv(&mut buf, &mut fds).unwrap(), None);
        // A second owner of the path is another socket: the old connection fails.
        drop(bell);
        let _again = Bell::bind(&path).unwrap();
        assert!(peer.send(BellMsg::Probe, None).is_err());
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }
}
