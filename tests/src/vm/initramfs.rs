//! The VM's root file system: a folder laid out like a merged-`/usr` Debian root, filled with
//! host files (and the shared libraries `ldd` says they load), packed as a gzip'd `newc` cpio.

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use tempfile::TempDir;

/// The top-level links of a merged-`/usr` root, so that a file reached through either spelling
/// on the host (`/lib/x86_64-linux-gnu/libc.so.6`, `/usr/lib/…`) is found the same in the VM.
const MERGED_USR: [(&str, &str); 4] = [
    ("bin", "usr/bin"),
    ("sbin", "usr/sbin"),
    ("lib", "usr/lib"),
    ("lib64", "usr/lib64"),
];

/// Empty folders the init script mounts on or writes to.
const MOUNT_POINTS: [&str; 7] = ["proc", "sys", "dev", "run", "tmp", "var", "usr/local/bin"];

/// A root file system being assembled in a temporary folder (removed on drop).
pub(super) struct Initramfs {
    root: TempDir,
    /// Guest paths already copied, so shared libraries are copied once.
    added: BTreeSet<PathBuf>,
}

impl Initramfs {
    /// An empty merged-`/usr` root.
    pub(super) fn new() -> Result<Self> {
        let root = tempfile::Builder::new()
            .prefix("splitproxy-initramfs.")
            .tempdir()
            .context("creating the initramfs folder")?;
        for (link, target) in MERGED_USR {
            fs::create_dir_all(root.path().join(target))?;
            symlink(target, root.path().join(link))?;
        }
        for dir in MOUNT_POINTS {
            fs::create_dir_all(root.path().join(dir))?;
        }
        // `ip netns` and iptables' lock expect /var/run to be /run.
        symlink("../run", root.path().join("var/run"))?;
        Ok(Self {
            root,
            added: BTreeSet::new(),
        })
    }

    /// Copies the host file `host` (following symlinks) to `guest`, with the shared libraries it
    /// loads at their host paths; a folder is copied with everything in it.
    pub(super) fn add(&mut self, host: &Path, guest: &Path) -> Result<()> {
        let meta = fs::metadata(host).with_context(|| format!("reading {}", host.display()))?;
        if meta.is_dir() {
            for entry in
                fs::read_dir(host).with_context(|| format!("listing {}", host.display()))?
            {
                let name = entry?.file_name();
                self.add(&host.join(&name), &guest.join(&name))?;
            }
            return Ok(());
        }
        if !self.added.insert(guest.to_owned()) {
            return Ok(());
        }
        let dest = self.path_of(guest)?;
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(host, &dest)
            .with_context(|| format!("copying {} into the initramfs", host.display()))?;
        if is_linked_elf(host)? {
            strip_debug_info(&dest)?;
            for library in shared_libraries(host)? {
                self.add(&library, &library)?;
            }
        }
        Ok(())
    }

    /// Writes `contents` to `guest`, executable when `executable`.
    pub(super) fn write(&mut self, guest: &Path, contents: &str, executable: bool) -> Result<()> {
        let dest = self.path_of(guest)?;
        fs::write(&dest, contents).with_context(|| format!("writing {}", guest.display()))?;
        let mode = if executable { 0o755 } else { 0o644 };
        fs::set_permissions(&dest, fs::Permissions::from_mode(mode))?;
        self.added.insert(guest.to_owned());
        Ok(())
    }

    /// Packs the root as a gzip'd `newc` cpio archive (what the kernel unpacks as its initramfs),
    /// every file owned by root, into `archive`.
    pub(super) fn pack(&self, archive: &Path) -> Result<()> {
        let status = Command::new("bash")
            .args([
                "-o",
                "pipefail",
                "-c",
                r#"find . -print0 | cpio --null -o -H newc -R 0:0 --quiet | gzip -1 >"$1""#,
                "pack",
            ])
            .arg(archive)
            .current_dir(self.root.path())
            .status()
            .context("running find | cpio | gzip")?;
        ensure!(status.success(), "packing the initramfs failed: {status}");
        Ok(())
    }

    /// Where the absolute guest path `guest` is inside the root folder.
    fn path_of(&self, guest: &Path) -> Result<PathBuf> {
        let mut parts = guest.components();
        ensure!(
            parts.next() == Some(Component::RootDir),
            "guest path {} is not absolute",
            guest.display()
        );
        ensure!(
            parts.clone().all(|c| matches!(c, Component::Normal(_))),
            "guest path {} has `..` or `.` in it",
            guest.display()
        );
        Ok(self.root.path().join(parts.as_path()))
    }
}

/// Drops the debug sections of the ELF file `path`: the workspace's debug builds are mostly
/// debug information (an agent of 150 MB is 20 MB without it), which the VM would hold in RAM.
fn strip_debug_info(path: &Path) -> Result<()> {
    let status = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(path)
        .status()
        .context("running objcopy (binutils)")?;
    ensure!(
        status.success(),
        "objcopy --strip-debug {} failed: {status}",
        path.display()
    );
    Ok(())
}

/// Whether `path` is an ELF executable or shared object, which may load shared libraries (as
/// opposed to a script, data, or a kernel module, which is a relocatable ELF file).
fn is_linked_elf(path: &Path) -> Result<bool> {
    // The magic, then class, data, version, OS ABI and padding, then the 16-bit type.
    let mut header = [0_u8; 18];
    let mut file = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    if file.read_exact(&mut header).is_err() || header[..4] != *b"\x7fELF" {
        return Ok(false);
    }
    // ET_EXEC or ET_DYN, little-endian (the host is x86-64).
    Ok(matches!(
        u16::from_le_bytes([header[16], header[17]]),
        2 | 3
    ))
}

/// The shared libraries `binary` loads, as `ldd` resolves them on the host; none for a static one.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        if stdout.contains("not a dynamic executable")
            || stderr.contains("not a dynamic executable")
        {
            return Ok(Vec::new());
        }
        bail!("ldd {} failed: {}", binary.display(), stderr.trim());
    }
    parse_ldd(&stdout).with_context(|| format!("libraries of {}", binary.display()))
}

/// The library paths in `ldd` output: `name => /path (0x…)` and the loader's `/path (0x…)`;
/// the kernel's vDSO has no file and is left out.
fn parse_ldd(output: &str) -> Result<Vec<PathBuf>> {
    let mut libraries = Vec::new();
    for line in output.lines().map(str::trim) {
        let resolved = line.split_once("=>").map_or(line, |(_, path)| path.trim());
        if resolved.starts_with("not found") {
            bail!("a library is missing on the host: {line}");
        }
        let path = resolved.split_whitespace().next().unwrap_or_default();
        if path.starts_with('/') {
            libraries.push(PathBuf::from(path));
        }
    }
    Ok(libraries)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn ldd_output_gives_the_libraries_and_the_loader() {
        let output = "\tlinux-vdso.so.1 (0x00007fe3af6ec000)
\tlibpopt.so.0 => /lib/x86_64-linux-gnu/libpopt.so.0 (0x00007fe3af6b7000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007fe3af4ab000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007fe3af6ee000)
";
        assert_eq!(
            parse_ldd(output).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libpopt.so.0",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn a_library_missing_on_the_host_is_an_error() {
        let err = parse_ldd("\tlibnl-3.so.200 => not found\n").unwrap_err();
        assert!(err.to_string().contains("libnl-3.so.200"), "{err}");
    }

    #[test]
    fn guest_paths_must_be_absolute_and_plain() {
        let initramfs = Initramfs::new().unwrap();
        assert!(initramfs.path_of(Path::new("usr/bin/x")).is_err());
        assert!(initramfs.path_of(Path::new("/usr/../etc/x")).is_err());
        assert!(
            initramfs
                .path_of(Path::new("/usr/bin/x"))
                .unwrap()
                .ends_with("usr/bin/x")
        );
    }
}
