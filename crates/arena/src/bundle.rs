//! A submission's bundle: a gzip tar of the files it changes, paths relative to the tree root.
//! `pack` writes one (regular files only, as `submit` does); `read` takes one apart into its
//! entries exactly as they are (links, devices and odd paths included), for policy to judge,
//! reading at most a capped number of bytes however the archive claims to be sized.

use std::io::Read;

use anyhow::{bail, Context, Result};
use flate2::bufread::GzDecoder;
use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};

/// What a tar entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Hardlink,
    Device,
    Fifo,
    Other,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::File => "a regular file",
            Kind::Dir => "a directory",
            Kind::Symlink => "a symbolic link",
            Kind::Hardlink => "a hard link",
            Kind::Device => "a device file",
            Kind::Fifo => "a FIFO",
            Kind::Other => "an entry of an unknown type",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Entry {
    /// The path as the archive spells it (lossy UTF-8 for messages; `raw_ok` says whether it
    /// was valid UTF-8).
    pub path: String,
    pub raw_ok: bool,
    pub kind: Kind,
    pub mode: u32,
    pub data: Vec<u8>,
}

/// What `pack` puts in a bundle: a file's contents and mode, or a symbolic link's target
/// (sent as it is, for policy to refuse with its reason). The other kinds are what `submit`
/// never sends and a hostile client can: the red-team corpus sends them (`redteam`).
#[derive(Debug)]
pub enum Content {
    File(Vec<u8>, u32),
    Symlink(String),
    Hardlink(String),
    /// A character device (1, 3: what /dev/null is).
    Device,
    Fifo,
}

impl Content {
    /// What it is, for a listing of a bundle.
    pub fn describe(&self) -> String {
        match self {
            Content::File(d, _) => format!("{} bytes", d.len()),
            Content::Symlink(t) => format!("symbolic link to {t}"),
            Content::Hardlink(t) => format!("hard link to {t}"),
            Content::Device => Kind::Device.name().to_string(),
            Content::Fifo => Kind::Fifo.name().to_string(),
        }
    }
}

/// Sets the header's path; a path tar itself refuses to write (absolute, or with `..`) is
/// written as it is, as a hostile client's own tar would.
fn set_path(h: &mut tar::Header, path: &str) -> Result<()> {
    if h.set_path(path).is_ok() {
        return Ok(());
    }
    let name = &mut h.as_old_mut().name;
    if path.len() > name.len() {
        bail!("{path}: longer than a plain tar name, and tar refuses it as a path");
    }
    name.fill(0);
    name[..path.len()].copy_from_slice(path.as_bytes());
    Ok(())
}

/// A gzip tar of `(path, content)`, deterministic (no times, no owners).
pub fn pack(entries: &[(String, Content)]) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(GzEncoder::new(Vec::new(), flate2::Compression::default()));
    for (path, c) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_size(0);
        h.set_mode(0o644);
        let mut data: &[u8] = &[];
        match c {
            Content::File(d, mode) => {
                h.set_size(d.len() as u64);
                // Setuid, setgid and sticky bits travel too: policy refuses them by name.
                h.set_mode(*mode & 0o7777);
                h.set_entry_type(tar::EntryType::Regular);
                data = d;
            }
            Content::Symlink(target) | Content::Hardlink(target) => {
                h.set_mode(0o777);
                h.set_entry_type(if matches!(c, Content::Symlink(_)) {
                    tar::EntryType::Symlink
                } else {
                    tar::EntryType::Link
                });
                h.set_link_name(target)
                    .with_context(|| format!("bundling {path}: link target {target}"))?;
            }
            Content::Device => {
                h.set_entry_type(tar::EntryType::Char);
                h.set_device_major(1)?;
                h.set_device_minor(3)?;
            }
            Content::Fifo => h.set_entry_type(tar::EntryType::Fifo),
        }
        set_path(&mut h, path).with_context(|| format!("bundling {path}"))?;
        h.set_cksum();
        b.append(&h, data)
            .with_context(|| format!("bundling {path}"))?;
    }
    Ok(b.into_inner()?.finish()?)
}

/// What a bundle may decompress to besides its files' contents: tar's 512-byte header per
/// entry and padding, long names and pax records (16,000 entries' worth). Without a bound a
/// small gzip could expand into a long name or a pax record that tar holds in memory whole, or
/// into millions of empty entries.
const TAR_OVERHEAD_BYTES: u64 = 8 << 20;

/// A reader that ends in an error, not silently, past `cap` bytes.
struct Capped<R> {
    inner: R,
    left: u64,
    cap: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            // At the cap the stream's end is fine; one byte more is not.
            let mut one = [0u8; 1];
            return match self.inner.read(&mut one)? {
                0 => Ok(0),
                _ => Err(std::io::Error::other(format!(
                    "it decompresses to more than {} bytes (its files' cap plus {} of tar headers)",
                    self.cap, TAR_OVERHEAD_BYTES
                ))),
            };
        }
        let n = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let got = self.inner.read(&mut buf[..n])?;
        self.left -= got as u64;
        Ok(got)
    }
}

/// The entries of a bundle, reading at most `max_bytes` of file contents in all, and at most
/// that plus `TAR_OVERHEAD_BYTES` of tar.
pub fn read(bytes: &[u8], max_bytes: u64) -> Result<Vec<Entry>> {
    let cap = max_bytes.saturating_add(TAR_OVERHEAD_BYTES);
    let mut ar = tar::Archive::new(Capped {
        inner: GzDecoder::new(bytes),
        left: cap,
        cap,
    });
    let mut out = vec![];
    let mut total = 0u64;
    for e in ar.entries().context("the bundle is not a gzip tar")? {
        let mut e = e.context("the bundle is not a readable gzip tar")?;
        let raw = e.path_bytes().into_owned();
        let (path, raw_ok) = match String::from_utf8(raw.clone()) {
            Ok(s) => (s, true),
            Err(_) => (String::from_utf8_lossy(&raw).into_owned(), false),
        };
        let h = e.header();
        let kind = match h.entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => Kind::File,
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::Symlink => Kind::Symlink,
            tar::EntryType::Link => Kind::Hardlink,
            tar::EntryType::Char | tar::EntryType::Block => Kind::Device,
            tar::EntryType::Fifo => Kind::Fifo,
            _ => Kind::Other,
        };
        let mode = h.mode().unwrap_or(0);
        let mut data = vec![];
        if kind == Kind::File {
            let size = h.size().unwrap_or(u64::MAX);
            if total.saturating_add(size) > max_bytes {
                bail!("the bundle's files add up to more than {max_bytes} bytes (at {path})");
            }
            (&mut e)
                .take(max_bytes - total)
                .read_to_end(&mut data)
                .with_context(|| format!("reading {path} from the bundle"))?;
            total += data.len() as u64;
        }
        out.push(Entry {
            path,
            raw_ok,
            kind,
            mode,
            data,
        });
    }
    // tar stops at its end-of-archive blocks; the gzip stream's end, where its CRC and length
    // are, is read only here: a bundle cut short or with a wrong CRC is refused, not half-read.
    let mut gz = ar.into_inner();
    std::io::copy(&mut gz, &mut std::io::sink())
        .context("the bundle is not a complete gzip stream")?;
    let rest = gz.inner.into_inner();
    if !rest.is_empty() {
        bail!(
            "the bundle has {} byte(s) after its gzip stream's end",
            rest.len()
        );
    }
    Ok(out)
}

/// `sha256:…` of bytes.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Whether `s` is written as `digest` writes one: `sha256:` and 64 hex digits.
pub fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gzip tar of `entries` (raw headers and data, as a hostile client would write them).
    fn gz_tar(write: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        write(&mut b);
        let tar = b.into_inner().unwrap();
        let mut z = GzEncoder::new(Vec::new(), flate2::Compression::best());
        std::io::Write::write_all(&mut z, &tar).unwrap();
        z.finish().unwrap()
    }

    #[test]
    fn a_small_gzip_cannot_expand_into_huge_tar_metadata() {
        // A 64 MiB GNU long name (tar reads it into memory whole) in a gzip of about 64 KiB.
        let long = gz_tar(|b| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::GNULongName);
            h.set_size(64 << 20);
            h.set_cksum();
            b.append(&h, std::io::repeat(b'a').take(64 << 20)).unwrap();
            let mut f = tar::Header::new_gnu();
            f.set_size(0);
            f.set_cksum();
            b.append(&f, &[][..]).unwrap();
        });
        assert!(long.len() < 1 << 20, "{}", long.len());
        let t = std::time::Instant::now();
        let e = format!("{:#}", read(&long, 1 << 20).unwrap_err());
        assert!(e.contains("decompresses to more than"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
        // Twenty thousand empty files: their headers alone pass the cap too.
        let many = gz_tar(|b| {
            for i in 0..20_000 {
                let mut h = tar::Header::new_gnu();
                h.set_size(0);
                h.set_path(format!("crates/cpu/src/f{i}.rs")).unwrap();
                h.set_cksum();
                b.append(&h, &[][..]).unwrap();
            }
        });
        let e = format!("{:#}", read(&many, 1 << 20).unwrap_err());
        assert!(e.contains("decompresses to more than"), "{e}");
        // A bundle within the caps still reads.
        let ok = gz_tar(|b| {
            let mut h = tar::Header::new_gnu();
            h.set_size(3);
            h.set_path("crates/cpu/src/a.rs").unwrap();
            h.set_cksum();
            b.append(&h, &b"abc"[..]).unwrap();
        });
        assert_eq!(read(&ok, 1 << 20).unwrap()[0].data, b"abc");
    }

    #[test]
    fn a_bundle_cut_short_with_a_wrong_crc_or_trailing_bytes_is_refused() {
        let ok = pack(&[(
            "crates/cpu/src/ops.rs".to_string(),
            Content::File(b"fn f() {}\n".to_vec(), 0o644),
        )])
        .unwrap();
        assert_eq!(read(&ok, 1 << 20).unwrap().len(), 1);
        let n = ok.len();
        // The trailer is the stream's last 8 bytes: CRC-32, then the length mod 2^32.
        let mut zero_crc = ok.clone();
        zero_crc[n - 8..n - 4].fill(0);
        let mut long = ok.clone();
        long.extend_from_slice(b"more");
        // Cut into the compressed data, the file's own read fails; cut into the trailer, or with
        // a wrong CRC, only the stream's end does.
        for (what, bytes, says) in [
            (
                "cut 20 bytes short",
                &ok[..n - 20],
                "incomplete deflate stream",
            ),
            (
                "cut 1 byte short",
                &ok[..n - 1],
                "not a complete gzip stream",
            ),
            ("CRC zeroed", &zero_crc[..], "not a complete gzip stream"),
            (
                "4 bytes appended",
                &long[..],
                "4 byte(s) after its gzip stream's end",
            ),
        ] {
            let e = format!("{:#}", read(bytes, 1 << 20).expect_err(what));
            assert!(e.contains(says), "{what}: {e}");
        }
    }

    #[test]
    fn a_bundle_round_trips_and_is_deterministic() {
        let files = || {
            vec![
                (
                    "crates/cpu/src/ops.rs".to_string(),
                    Content::File(b"fn f() {}\n".to_vec(), 0o644),
                ),
                (
                    "crates/engine/src/a.rs".to_string(),
                    Content::File(vec![], 0o644),
                ),
                (
                    "crates/engine/src/l.rs".to_string(),
                    Content::Symlink("/etc/passwd".into()),
                ),
            ]
        };
        let a = pack(&files()).unwrap();
        assert_eq!(digest(&a), digest(&pack(&files()).unwrap()));
        let e = read(&a, 1 << 20).unwrap();
        assert_eq!(e.len(), 3);
        // What a hostile client sends comes back as it was sent, for policy to judge.
        let odd = pack(&[
            (
                "../escape.rs".to_string(),
                Content::File(b"x".to_vec(), 0o644),
            ),
            ("/etc/cron.d/x".to_string(), Content::File(vec![], 0o644)),
            (
                "crates/cpu/src/h.rs".to_string(),
                Content::Hardlink("Cargo.toml".into()),
            ),
            ("crates/cpu/src/d".to_string(), Content::Device),
            ("crates/cpu/src/f".to_string(), Content::Fifo),
        ])
        .unwrap();
        let o = read(&odd, 1 << 20).unwrap();
        let got: Vec<(&str, Kind)> = o.iter().map(|e| (e.path.as_str(), e.kind)).collect();
        assert_eq!(
            got,
            [
                ("../escape.rs", Kind::File),
                ("/etc/cron.d/x", Kind::File),
                ("crates/cpu/src/h.rs", Kind::Hardlink),
                ("crates/cpu/src/d", Kind::Device),
                ("crates/cpu/src/f", Kind::Fifo),
            ]
        );
        assert_eq!(o[0].data, b"x");
        assert_eq!(e[2].kind, Kind::Symlink);
        assert_eq!(e[0].path, "crates/cpu/src/ops.rs");
        assert_eq!(e[0].kind, Kind::File);
        assert_eq!(e[0].data, b"fn f() {}\n");
        assert!(read(&a, 4).is_err());
        assert!(read(b"not a tar", 1 << 20).is_err());
    }
}
