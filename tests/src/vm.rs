//! A qemu VM on a stock Debian kernel, for what the development kernel lacks (IPVS): boots an
//! initramfs built from host files, runs one shell script as root and returns its output and exit
//! status over the serial console.
//!
//! `vm/build-vm.sh` pins the kernel and installs qemu; the VM has no disk and no network to the
//! host. It runs under software emulation (TCG) unless `SPLITPROXY_VM_ACCEL=kvm`: `/dev/kvm` can
//! exist and still fail on nested virtualization, and TCG boots this kernel in a few seconds.

mod init;
mod initramfs;
pub mod ipvs_node;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};

use crate::built_tool;
use initramfs::Initramfs;

/// The accelerator qemu uses, from `SPLITPROXY_VM_ACCEL`.
const ACCEL_ENV: &str = "SPLITPROXY_VM_ACCEL";

/// The kernel and modules `vm/build-vm.sh` prepared in the tools cache.
#[derive(Clone, Debug)]
pub struct VmImage {
    /// The folder holding `vmlinuz` and `lib/modules/<release>/`.
    dir: PathBuf,
}

impl VmImage {
    /// Runs `vm/build-vm.sh` (quick once cached) and checks what it prepared.
    ///
    /// # Errors
    ///
    /// If the script fails (no qemu can be installed, the kernel package cannot be downloaded) or
    /// its folder lacks the kernel.
    pub fn setup() -> Result<Self> {
        let dir = built_tool("vm/build-vm.sh")?;
        ensure!(
            dir.join("vmlinuz").is_file(),
            "{} has no vmlinuz",
            dir.display()
        );
        Ok(Self { dir })
    }

    /// [`Self::setup`] for a test: `None` when the VM tools cannot be set up outside CI (said on
    /// stderr, the test then skips); under `CI=true` that fails.
    ///
    /// # Errors
    ///
    /// Under `CI=true`, if [`Self::setup`] fails.
    pub fn for_test() -> Result<Option<Self>> {
        match Self::setup() {
            Ok(image) => Ok(Some(image)),
            Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
                eprintln!("SKIPPED: the VM tools cannot be set up here: {e:#}");
                Ok(None)
            }
            Err(e) => Err(e.context("the VM tools must be set up under CI=true")),
        }
    }
}

/// How qemu executes the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    /// Software emulation: slower, works everywhere.
    Tcg,
    /// Hardware virtualization through `/dev/kvm`.
    Kvm,
}

impl Accel {
    /// `SPLITPROXY_VM_ACCEL`: `tcg` (the default when unset) or `kvm`.
    ///
    /// # Errors
    ///
    /// If it holds anything else.
    pub fn from_env() -> Result<Self> {
        match std::env::var(ACCEL_ENV).as_deref() {
            Err(_) | Ok("" | "tcg") => Ok(Self::Tcg),
            Ok("kvm") => Ok(Self::Kvm),
            Ok(other) => bail!("{ACCEL_ENV} is {other:?}; expected tcg or kvm"),
        }
    }

    /// qemu's flags for it.
    fn qemu_args(self) -> &'static [&'static str] {
        match self {
            Self::Tcg => &["-accel", "tcg"],
            Self::Kvm => &["-accel", "kvm", "-cpu", "host"],
        }
    }
}

/// A VM to boot: its kernel, the files and modules it gets, and how long it may take.
#[derive(Clone, Debug)]
pub struct Vm {
    image: VmImage,
    /// (host path, guest path) pairs.
    files: Vec<(PathBuf, PathBuf)>,
    modules: Vec<String>,
    timeout: Duration,
    accel: Accel,
}

/// What one boot of the VM did.
#[derive(Debug)]
pub struct VmRun {
    /// The script's stdout and stderr (it runs with bash), interleaved as printed.
    pub output: String,
    /// The script's exit status.
    pub status: i32,
    /// The guest's uptime when the script started: kernel boot plus module loading.
    pub guest_boot: Duration,
    /// From starting qemu to its exit, as the host saw it (the initramfs is packed before).
    pub wall: Duration,
    /// How qemu executed the guest.
    pub accel: Accel,
}

impl Vm {
    /// A VM on `image` with only busybox and the kernel modules, stopped after 4 minutes, with the
    /// accelerator `SPLITPROXY_VM_ACCEL` names.
    ///
    /// # Errors
    ///
    /// If `SPLITPROXY_VM_ACCEL` is invalid.
    pub fn new(image: VmImage) -> Result<Self> {
        Ok(Self {
            image,
            files: Vec::new(),
            modules: Vec::new(),
            timeout: Duration::from_secs(240),
            accel: Accel::from_env()?,
        })
    }

    /// Copies these host files (binaries, or folders such as iptables' extensions) to the same
    /// paths in the VM, with the shared libraries they load.
    #[must_use]
    pub fn with_host_files<P: AsRef<Path>>(mut self, paths: impl IntoIterator<Item = P>) -> Self {
        for path in paths {
            let path = path.as_ref();
            self.files.push((path.to_owned(), path.to_owned()));
        }
        self
    }

    /// Copies the host file `host` to `guest` (an absolute path) in the VM, with its libraries.
    #[must_use]
    pub fn with_file(mut self, host: impl Into<PathBuf>, guest: impl Into<PathBuf>) -> Self {
        self.files.push((host.into(), guest.into()));
        self
    }

    /// Kernel modules that `/init` loads (with their dependencies) before the script runs. Others
    /// the kernel asks for itself, such as netfilter extensions, load on demand.
    #[must_use]
    pub fn with_modules<S: Into<String>>(mut self, modules: impl IntoIterator<Item = S>) -> Self {
        self.modules.extend(modules.into_iter().map(Into::into));
        self
    }

    /// Stops the VM after `timeout` and fails the run.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Boots the VM, runs `script` with bash as root in it, and powers it off. Commands the
    /// caller did not copy in are busybox's.
    ///
    /// # Errors
    ///
    /// If the initramfs cannot be built, qemu cannot start, or the script did not finish (a
    /// module failed to load, the VM crashed or hit the timeout): the error holds the console.
    pub fn run(&self, script: &str) -> Result<VmRun> {
        let work = tempfile::Builder::new()
            .prefix("splitproxy-vm.")
            .tempdir()
            .context("creating the VM's work folder")?;
        let archive = work.path().join("initramfs.cpio.gz");
        self.initramfs(script)?.pack(&archive)?;

        let console = work.path().join("console.log");
        let qemu_log = work.path().join("qemu.log");
        let started = Instant::now();
        let mut qemu = Qemu(
            Command::new("qemu-system-x86_64")
                .args(self.accel.qemu_args())
                .args([
                    "-m",
                    "1024",
                    "-nodefaults",
                    "-display",
                    "none",
                    "-no-reboot",
                ])
                .arg("-serial")
                .arg(format!("file:{}", console.display()))
                .arg("-kernel")
                .arg(self.image.dir.join("vmlinuz"))
                .arg("-initrd")
                .arg(&archive)
                .args(["-append", "console=ttyS0 panic=-1 quiet"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(fs::File::create(&qemu_log)?)
                .spawn()
                .context("starting qemu-system-x86_64 (run tests/vm/build-vm.sh)")?,
        );
        let exited = qemu.wait_for(self.timeout)?;
        let wall = started.elapsed();

        let console_text = fs::read_to_string(&console).unwrap_or_default();
        let details = || {
            format!(
                "qemu: {}\nconsole:\n{console_text}",
                fs::read_to_string(&qemu_log).unwrap_or_default().trim()
            )
        };
        if !exited {
            bail!(
                "the VM did not power off within {:?}\n{}",
                self.timeout,
                details()
            );
        }
        let finished =
            init::parse_console(&console_text).map_err(|e| anyhow!("{e:#}\n{}", details()))?;
        Ok(VmRun {
            output: finished.output,
            status: finished.status,
            guest_boot: finished.guest_boot,
            wall,
            accel: self.accel,
        })
    }

    /// The root file system: busybox, the kernel modules, the caller's files, `/init` and the
    /// script.
    fn initramfs(&self, script: &str) -> Result<Initramfs> {
        let mut initramfs = Initramfs::new()?;
        initramfs.add(Path::new("/bin/busybox"), Path::new("/bin/busybox"))?;
        initramfs.add(Path::new(init::SHELL), Path::new(init::SHELL))?;
        initramfs.add(&self.image.dir.join("lib"), Path::new("/lib"))?;
        for (host, guest) in &self.files {
            initramfs.add(host, guest)?;
        }
        initramfs.write(Path::new("/init"), &init::init_script(&self.modules), true)?;
        initramfs.write(Path::new(init::SCRIPT_PATH), script, false)?;
        Ok(initramfs)
    }
}

/// The qemu process, killed on drop so a failing test leaves no VM behind.
struct Qemu(Child);

impl Qemu {
    /// Waits up to `timeout` for qemu to exit; whether it did.
    fn wait_for(&mut self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.0.try_wait().context("waiting for qemu")?.is_some() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(false)
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        // Already exited or already gone: nothing to clean up either way.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
