//! The packet programs (`bpf/tc.c`), which serve traffic from outside the node: loaded beside
//! the socket programs and sharing their services map through its pin, attached to the ingress
//! and egress of each device that takes node ports with TCX links pinned as the socket
//! programs' links are, and the nftables table ([`nft_table`]) that masquerades what they mark
//! and refuses what they let through for want of endpoints.
//!
//! TCX (Linux 6.6) gives links that can be pinned and replaced without a moment with no program
//! on the device; on an older kernel the programs are not attached, and only the node's own
//! traffic is served (the agent says so once).

use super::error::{Error, is_missing, load_error, pins_error};
use super::layout::{FLOW_LEN, Flow, REPLY_LEN, TUPLE_LEN};
use super::links::pin_replacing;
use super::nft_table::{self, Refused};
use crate::Protocol;
use aya::maps::{HashMap as AyaHashMap, MapData, MapError};
use aya::programs::tc::TcAttachOptions;
use aya::programs::{LinkOrder, ProgramError, SchedClassifier, TcAttachType};
use aya::util::KernelVersion;
use aya::{Ebpf, EbpfLoader};
use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

/// `bpf/tc.c`, compiled by the build script.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tc.o"));

/// The programs, each with the direction it is attached in.
const PROGRAMS: [(&str, TcAttachType); 2] = [
    ("sp_from_outside", TcAttachType::Ingress),
    ("sp_to_outside", TcAttachType::Egress),
];

/// The map of connections from outside and their endpoints (`sp_flows`).
const FLOWS_MAP: &str = "sp_flows";

/// The map of their replies' translations (`sp_replies`).
const REPLIES_MAP: &str = "sp_replies";

/// The packet programs, loaded, and the devices they are attached to.
#[derive(Debug)]
pub struct Packets {
    ebpf: Ebpf,
    links: PathBuf,
    stamp: u128,
    attached: BTreeSet<u32>,
    /// What the nftables table refuses now.
    refused: BTreeSet<Refused>,
}

impl Packets {
    /// Loads the programs with the maps pinned in `maps` (the services map the socket programs
    /// hold included) and writes the nftables table, its masquerade rule for
    /// `masquerade_mark`; `None` on a
    /// kernel without TCX. Links go in `links`, named with `stamp`.
    ///
    /// # Errors
    ///
    /// Returns an error when the kernel refuses a program or the table cannot be written.
    pub fn load(
        maps: &Path,
        links: &Path,
        stamp: u128,
        masquerade_mark: u32,
    ) -> Result<Option<Self>, Error> {
        if KernelVersion::current().is_ok_and(|version| version < KernelVersion::new(6, 6, 0)) {
            tracing::warn!(
                "this kernel has no TCX (Linux 6.6): the ebpf mode serves the node's own \
                 traffic only, and its node ports answer nothing from outside"
            );
            return Ok(None);
        }
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(maps)
            .override_global("masquerade_mark", &masquerade_mark, true)
            .load(OBJECT)
            .map_err(Error::Maps)?;
        for (program, _) in PROGRAMS {
            classifier(&mut ebpf, program)?
                .load()
                .map_err(|err| load_error(program, err))?;
        }
        nft_table::install(masquerade_mark)?;
        Ok(Some(Self {
            ebpf,
            links: links.to_owned(),
            stamp,
            attached: BTreeSet::new(),
            refused: BTreeSet::new(),
        }))
    }

    /// Attaches the programs to each of `devices` they are not attached to yet, replacing an
    /// earlier agent's links there, and unpins the links on devices no longer named.
    ///
    /// # Errors
    ///
    /// Returns an error when a device is missing or refuses the programs.
    pub fn attach(&mut self, devices: &[String]) -> Result<(), Error> {
        let mut wanted = BTreeSet::new();
        for device in devices {
            let index =
                nix::net::if_::if_nametoindex(device.as_str()).map_err(|errno| Error::Attach {
                    program: PROGRAMS[0].0,
                    source: format!("device {device}: {}", errno.desc()).into(),
                })?;
            wanted.insert(index);
            if self.attached.contains(&index) {
                continue;
            }
            for (program, direction) in PROGRAMS {
                let attach = |source: Box<dyn std::error::Error + Send + Sync>| Error::Attach {
                    program,
                    source: format!("device {device}: {source}").into(),
                };
                let loaded = classifier(&mut self.ebpf, program)?;
                let id = loaded
                    .attach_with_options(
                        device,
                        direction,
                        TcAttachOptions::TcxOrder(LinkOrder::default()),
                    )
                    .map_err(|err| attach(err.into()))?;
                let link = loaded.take_link(id).map_err(|err| attach(err.into()))?;
                pin_replacing(link, &self.links, &format!("{program}-{index}"), self.stamp)
                    .map_err(attach)?;
            }
            self.attached.insert(index);
        }
        self.attached.retain(|index| wanted.contains(index));
        self.unpin_other_devices(&wanted)
    }

    /// Forgets the UDP connections from outside that went to an endpoint their Service port no
    /// longer has (`gone`: Service address and endpoint), and their replies' translation, so
    /// their next datagram chooses again, as kube-proxy deletes such conntrack entries. TCP
    /// connections keep theirs: a terminating endpoint finishes what it serves.
    ///
    /// # Errors
    ///
    /// Returns an error when the maps cannot be read or written.
    pub fn forget_udp_flows(
        &mut self,
        gone: &HashSet<(SocketAddr, SocketAddr)>,
    ) -> Result<(), Error> {
        if gone.is_empty() {
            return Ok(());
        }
        let mut stale = Vec::new();
        let mut flows = self.map::<FLOW_LEN>(FLOWS_MAP)?;
        for entry in flows.iter() {
            let (key, value) = entry.map_err(Error::Map)?;
            let flow = Flow::from_bytes(&key, &value);
            if flow.protocol == Some(Protocol::Udp)
                && gone.contains(&(flow.frontend, flow.endpoint))
            {
                stale.push((key, flow.reply_key(&key)));
            }
        }
        for (key, _) in &stale {
            forget(&mut flows, key)?;
        }
        let mut replies = self.map::<REPLY_LEN>(REPLIES_MAP)?;
        for (_, reply) in &stale {
            forget(&mut replies, reply)?;
        }
        Ok(())
    }

    /// What the nftables table refuses from outside now.
    #[must_use]
    pub fn refused(&self) -> &BTreeSet<Refused> {
        &self.refused
    }

    /// Makes `refused` what the nftables table refuses from outside (the Service addresses and
    /// ports without endpoints the packet programs let through), when that changes it.
    ///
    /// # Errors
    ///
    /// Returns what nft said when it refuses.
    pub fn refuse(&mut self, refused: BTreeSet<Refused>) -> Result<(), Error> {
        if refused != self.refused {
            nft_table::refuse(&refused)?;
            self.refused = refused;
        }
        Ok(())
    }

    /// One of the programs' LRU maps, by name.
    fn map<const V: usize>(
        &mut self,
        name: &str,
    ) -> Result<AyaHashMap<&mut MapData, [u8; TUPLE_LEN], [u8; V]>, Error> {
        let map = self.ebpf.map_mut(name).ok_or_else(|| {
            Error::Maps(aya::EbpfError::MapError(MapError::InvalidName {
                name: name.to_owned(),
            }))
        })?;
        AyaHashMap::try_from(map).map_err(Error::Map)
    }

    /// Unpins the links of devices outside `wanted` (an earlier selection's, or gone).
    fn unpin_other_devices(&self, wanted: &BTreeSet<u32>) -> Result<(), Error> {
        let links = &self.links;
        for entry in fs::read_dir(links).map_err(|source| pins_error(links, source))? {
            let entry = entry.map_err(|source| pins_error(links, source))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let device = PROGRAMS.iter().find_map(|(program, _)| {
                let rest = name.strip_prefix(program)?.strip_prefix('-')?;
                rest.split('-').next()?.parse::<u32>().ok()
            });
            if device.is_some_and(|index| !wanted.contains(&index)) {
                fs::remove_file(entry.path())
                    .map_err(|source| pins_error(&entry.path(), source))?;
            }
        }
        Ok(())
    }
}

/// Removes `key`; one already gone (evicted) is fine.
fn forget<const V: usize>(
    map: &mut AyaHashMap<&mut MapData, [u8; TUPLE_LEN], [u8; V]>,
    key: &[u8; TUPLE_LEN],
) -> Result<(), Error> {
    match map.remove(key) {
        Err(err) if !is_missing(&err) => Err(Error::Map(err)),
        _ => Ok(()),
    }
}

fn classifier<'a>(
    ebpf: &'a mut Ebpf,
    program: &'static str,
) -> Result<&'a mut SchedClassifier, Error> {
    ebpf.program_mut(program)
        .ok_or_else(|| Error::Attach {
            program,
            source: "missing from the embedded object".into(),
        })?
        .try_into()
        .map_err(|err: ProgramError| Error::Attach {
            program,
            source: err.into(),
        })
}

/// The devices holding any of `addresses` (the node-port addresses), by name.
///
/// # Errors
///
/// Returns an error when the interfaces cannot be listed.
pub fn devices_holding(addresses: &[IpAddr]) -> Result<Vec<String>, Error> {
    let mut devices: Vec<String> = if_addrs::get_if_addrs()
        .map_err(Error::NodeAddresses)?
        .into_iter()
        .filter(|interface| !interface.is_loopback() && addresses.contains(&interface.ip()))
        .map(|interface| interface.name)
        .collect();
    devices.sort_unstable();
    devices.dedup();
    Ok(devices)
}
