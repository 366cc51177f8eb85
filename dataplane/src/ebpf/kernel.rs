//! The eBPF mode's kernel side: the embedded programs loaded with aya and attached to a cgroup,
//! their maps and links pinned in a BPF filesystem so that traffic keeps its Services while no
//! agent runs, and the services map's reads and writes.
//!
//! Pins live under `<bpf root>/splitproxy/<layout version>/`: the maps by name, each link as
//! `links/<program>-<stamp>` (bpffs refuses dots in names). An agent that starts loads the programs again, reuses the pinned
//! maps (their entries stay, the sync reconciles them in place), attaches its programs beside
//! the old ones and only then unpins the old links, so no connection meets a cgroup without a
//! program. The old and new programs may both run for a moment: a socket the first sends to an
//! endpoint no longer matches a Service for the second.

use super::capabilities;
use super::entries::{Entries, Write};
pub use super::error::Error;
use super::error::{is_missing, load_error, pins_error};
use super::layout::{self, KEY_LEN, SERVICES_MAP, SlotKey, SlotValue, VALUE_LEN};
use super::links::pin_replacing;
use super::nft_table::{self, Refused};
use super::packets::Packets;
use aya::maps::{HashMap, MapData, MapError};
use aya::programs::{CgroupAttachMode, CgroupSockAddr, ProgramError};
use aya::{EbpfError, EbpfLoader};
use nix::sys::statfs::{BPF_FS_MAGIC, CGROUP2_SUPER_MAGIC, statfs};
use std::collections::BTreeSet;
use std::fs::{self, File};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// `bpf/sock.c`, compiled by the build script.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sock.o"));

/// The programs of `bpf/sock.c`, each attached to the cgroup.
const PROGRAMS: [&str; 8] = [
    "sp_connect4",
    "sp_connect6",
    "sp_sendmsg4",
    "sp_sendmsg6",
    "sp_recvmsg4",
    "sp_recvmsg6",
    "sp_getpeername4",
    "sp_getpeername6",
];

/// The folder of splitproxy's pins under a BPF filesystem.
const PIN_FOLDER: &str = "splitproxy";

/// The programs attached, and the services map they read.
pub struct Attached {
    services: HashMap<MapData, [u8; KEY_LEN], [u8; VALUE_LEN]>,
    capacity: usize,
    /// The packet programs; `None` on a kernel without TCX.
    packets: Option<Packets>,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attached")
            .field("capacity", &self.capacity)
            .field("packets", &self.packets)
            .finish_non_exhaustive()
    }
}

impl Attached {
    /// Loads the programs, opens (or creates) the pinned maps under `bpf_root` and attaches the
    /// socket programs to the cgroup v2 folder `cgroup`, replacing an earlier agent's links
    /// there; loads the packet programs, which mark connections to masquerade with
    /// `masquerade_mark`, for [`attach_devices`](Self::attach_devices).
    ///
    /// # Errors
    ///
    /// Returns an error naming what the kernel, the node or the agent lacks: a capability, a
    /// BPF filesystem, a cgroup v2 hierarchy, a program the kernel refuses.
    pub fn new(bpf_root: &Path, cgroup: &Path, masquerade_mark: u32) -> Result<Self, Error> {
        capabilities::check()?;
        ensure_bpffs(bpf_root)?;
        check_cgroup2(cgroup)?;
        let pins = bpf_root.join(PIN_FOLDER);
        let current = map_pins(bpf_root);
        let links = current.join("links");
        fs::create_dir_all(&links).map_err(|source| pins_error(&links, source))?;
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(&current)
            .load(OBJECT)
            .map_err(Error::Maps)?;
        let cgroup_folder = File::open(cgroup).map_err(|source| pins_error(cgroup, source))?;
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        for program in PROGRAMS {
            let attach = |source: Box<dyn std::error::Error + Send + Sync>| Error::Attach {
                program,
                source,
            };
            let loaded: &mut CgroupSockAddr = ebpf
                .program_mut(program)
                .ok_or_else(|| attach("missing from the embedded object".into()))?
                .try_into()
                .map_err(|err: ProgramError| attach(err.into()))?;
            loaded.load().map_err(|err| load_error(program, err))?;
            // A link is never exclusive: attached with no flags, it runs beside other links
            // (an earlier agent's) and programs attached without one.
            let id = loaded
                .attach(&cgroup_folder, CgroupAttachMode::Single)
                .map_err(|err| attach(err.into()))?;
            let link = loaded.take_link(id).map_err(|err| attach(err.into()))?;
            pin_replacing(link, &links, program, stamp).map_err(attach)?;
        }
        let packets = Packets::load(&current, &links, stamp, masquerade_mark)?;
        remove_other_versions(&pins)?;
        let map = ebpf.take_map(SERVICES_MAP).ok_or_else(|| {
            Error::Maps(EbpfError::MapError(MapError::InvalidName {
                name: SERVICES_MAP.to_owned(),
            }))
        })?;
        let services: HashMap<MapData, [u8; KEY_LEN], [u8; VALUE_LEN]> =
            HashMap::try_from(map).map_err(Error::Map)?;
        let capacity = aya::maps::IterableMap::map(&services)
            .info()
            .map_err(Error::Map)?
            .max_entries() as usize;
        Ok(Self {
            services,
            capacity,
            packets,
        })
    }

    /// Forgets the UDP connections from outside to endpoints gone from their Service port
    /// ([`Packets::forget_udp_flows`]); nothing on a kernel without TCX.
    ///
    /// # Errors
    ///
    /// Returns an error when the programs' maps refuse.
    pub fn forget_udp_flows(
        &mut self,
        gone: &std::collections::HashSet<(std::net::SocketAddr, std::net::SocketAddr)>,
    ) -> Result<(), Error> {
        self.packets
            .as_mut()
            .map_or(Ok(()), |packets| packets.forget_udp_flows(gone))
    }

    /// What the packet programs' nftables table refuses from outside now; nothing on a kernel
    /// without TCX.
    #[must_use]
    pub fn refused(&self) -> BTreeSet<Refused> {
        self.packets
            .as_ref()
            .map(|packets| packets.refused().clone())
            .unwrap_or_default()
    }

    /// Makes `refused` what the packet programs' nftables table refuses from outside
    /// ([`Packets::refuse`]); nothing on a kernel without TCX.
    ///
    /// # Errors
    ///
    /// Returns what nft said when it refuses.
    pub fn refuse(&mut self, refused: BTreeSet<Refused>) -> Result<(), Error> {
        self.packets
            .as_mut()
            .map_or(Ok(()), |packets| packets.refuse(refused))
    }

    /// Attaches the packet programs to `devices` (once each), and takes them off devices no
    /// longer named; nothing on a kernel without TCX.
    ///
    /// # Errors
    ///
    /// Returns an error when a device is missing or refuses them.
    pub fn attach_devices(&mut self, devices: &[String]) -> Result<(), Error> {
        self.packets
            .as_mut()
            .map_or(Ok(()), |packets| packets.attach(devices))
    }

    /// The services map's entries, and the keys no agent of this layout writes (to delete).
    ///
    /// # Errors
    ///
    /// Returns an error when the map cannot be read.
    pub fn entries(&self) -> Result<(Entries, Vec<[u8; KEY_LEN]>), Error> {
        let mut entries = Entries::new();
        let mut foreign = Vec::new();
        for entry in self.services.iter() {
            let (key, value) = entry.map_err(Error::Map)?;
            match SlotKey::from_bytes(key) {
                Some(slot) => {
                    entries.insert(slot, SlotValue::from_bytes(slot, value));
                }
                None => foreign.push(key),
            }
        }
        Ok((entries, foreign))
    }

    /// Deletes keys no agent of this layout writes.
    ///
    /// # Errors
    ///
    /// Returns an error when the map refuses a deletion.
    pub fn delete_foreign(&mut self, keys: &[[u8; KEY_LEN]]) -> Result<(), Error> {
        keys.iter()
            .try_for_each(|key| remove(&mut self.services, key))
    }

    /// Writes `writes` in order, after checking that the `needed` entries they leave fit the
    /// map.
    ///
    /// # Errors
    ///
    /// Returns an error when the entries would not fit (nothing is written then) or the map
    /// refuses a write (the earlier ones stay: each leaves a consistent map).
    pub fn write(&mut self, needed: usize, writes: &[Write]) -> Result<(), Error> {
        if needed > self.capacity {
            return Err(Error::Full {
                needed,
                capacity: self.capacity,
            });
        }
        for write in writes {
            match *write {
                Write::Put(key, value) => self
                    .services
                    .insert(key.to_bytes(), value.to_bytes(), 0)
                    .map_err(Error::Map)?,
                Write::Delete(key) => remove(&mut self.services, &key.to_bytes())?,
            }
        }
        Ok(())
    }
}

/// Where the maps of this layout are pinned under the BPF filesystem `bpf_root`, each by its name.
#[must_use]
pub fn map_pins(bpf_root: &Path) -> PathBuf {
    bpf_root.join(PIN_FOLDER).join(layout::VERSION)
}

/// Removes `key`; one already gone is fine.
fn remove(
    services: &mut HashMap<MapData, [u8; KEY_LEN], [u8; VALUE_LEN]>,
    key: &[u8; KEY_LEN],
) -> Result<(), Error> {
    match services.remove(key) {
        Err(err) if !is_missing(&err) => Err(Error::Map(err)),
        _ => Ok(()),
    }
}

/// The addresses taking node ports under `selection`
/// ([`Config::node_port_addresses`](super::Config::node_port_addresses)), the node's interfaces
/// listed only when the selection needs them. Never loopback ones: a pod's own loopback
/// connections go through the same programs, and must stay its own (upstream's nftables mode
/// has no localhost node ports either).
///
/// # Errors
///
/// Returns an error when the interfaces cannot be listed.
pub fn node_port_addresses(selection: Option<&[IpAddr]>) -> Result<Vec<IpAddr>, Error> {
    let interfaces = if crate::node_port_addresses::needs_interfaces(selection) {
        if_addrs::get_if_addrs().map_err(Error::NodeAddresses)?
    } else {
        Vec::new()
    };
    let mut addresses = crate::node_port_addresses::select(selection, &interfaces, "");
    addresses.retain(|ip| !ip.is_loopback());
    addresses.sort_unstable();
    addresses.dedup();
    Ok(addresses)
}

/// Where the cgroup v2 hierarchy is mounted, as this process's mount table says (`None`: it is
/// not).
///
/// # Errors
///
/// Returns an error when the mount table cannot be read.
pub fn cgroup2_mount() -> std::io::Result<Option<PathBuf>> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mountinfo.lines().find_map(|line| {
        // `id parent major:minor root mount-point options… - type source super-options`
        let (mount, filesystem) = line.split_once(" - ")?;
        (filesystem.split(' ').next() == Some("cgroup2"))
            .then(|| mount.split(' ').nth(4).map(PathBuf::from))?
    }))
}

/// Removes everything the eBPF mode put in place: what it pinned under `bpf_root`, its links
/// (the programs detach) and its maps, and its nftables table. Returns whether there was
/// anything.
///
/// # Errors
///
/// Returns an error when a pin or the table cannot be removed.
pub fn remove_pins(bpf_root: &Path) -> Result<bool, Error> {
    let pins = bpf_root.join(PIN_FOLDER);
    let pinned = match fs::remove_dir_all(&pins) {
        Ok(()) => true,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => false,
        Err(source) => return Err(pins_error(&pins, source)),
    };
    Ok(nft_table::remove()? || pinned)
}

/// Removes the pins of other layout versions, once this version's programs are attached.
fn remove_other_versions(pins: &Path) -> Result<(), Error> {
    for entry in fs::read_dir(pins).map_err(|source| pins_error(pins, source))? {
        let entry = entry.map_err(|source| pins_error(pins, source))?;
        if entry.file_name() != layout::VERSION {
            fs::remove_dir_all(entry.path()).map_err(|source| pins_error(&entry.path(), source))?;
        }
    }
    Ok(())
}

/// Mounts a BPF filesystem at `path` unless one is there.
///
/// A mount made here lives in the caller's mount namespace: in a container or under
/// `ip netns exec`, it (and every pin in it) goes when the caller does, unless it propagates to
/// the node (a privileged init container's hostPath with Bidirectional propagation), so the
/// warning says so.
///
/// # Errors
///
/// Returns an error when the folder cannot be made or the filesystem cannot be mounted.
pub fn ensure_bpffs(path: &Path) -> Result<(), Error> {
    let fail = |reason: String| Error::BpfFs {
        path: path.to_owned(),
        reason,
    };
    fs::create_dir_all(path).map_err(|err| fail(err.to_string()))?;
    if statfs(path).is_ok_and(|fs| fs.filesystem_type() == BPF_FS_MAGIC) {
        return Ok(());
    }
    nix::mount::mount(
        Some("bpffs"),
        path,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|errno| fail(errno.desc().to_owned()))?;
    tracing::warn!(
        bpf_root = %path.display(),
        "mounted a BPF filesystem: the pins outlive the agent only if this mount is the node's \
         (in a container, a hostPath mounted with Bidirectional propagation)"
    );
    Ok(())
}

/// Checks that `path` is a cgroup v2 folder.
fn check_cgroup2(path: &Path) -> Result<(), Error> {
    let reason = match statfs(path) {
        Ok(fs) if fs.filesystem_type() == CGROUP2_SUPER_MAGIC => return Ok(()),
        Ok(fs) => format!("filesystem type {:#x}", fs.filesystem_type().0),
        Err(errno) => errno.desc().to_owned(),
    };
    Err(Error::NotCgroup2 {
        path: path.to_owned(),
        reason,
    })
}
