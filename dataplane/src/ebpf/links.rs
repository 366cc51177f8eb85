//! The programs' links, pinned under `links/` by program and stamp, so that each outlives the
//! agent and a new agent's replaces it without a moment with no program.

use super::error::Error;
use super::error::pins_error;
use aya::programs::links::FdLink;
use std::fs;
use std::path::Path;

/// Pins `link` in `links` as `<prefix>-<stamp>`, then unpins the other links named `<prefix>-…`
/// (an earlier agent's): the new program runs before the old ones stop.
pub fn pin_replacing<L>(
    link: L,
    links: &Path,
    prefix: &str,
    stamp: u128,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    L: TryInto<FdLink, Error = aya::programs::links::LinkError>,
{
    let link: FdLink = link.try_into()?;
    let name = format!("{prefix}-{stamp}");
    link.pin(links.join(&name))?;
    unpin_other_links(links, prefix, &name)?;
    Ok(())
}

/// Unpins `program`'s links other than `keep` (an earlier agent's): each detaches once unpinned.
fn unpin_other_links(links: &Path, program: &str, keep: &str) -> Result<(), Error> {
    let prefix = format!("{program}-");
    for entry in fs::read_dir(links).map_err(|source| pins_error(links, source))? {
        let entry = entry.map_err(|source| pins_error(links, source))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && name != keep {
            fs::remove_file(entry.path()).map_err(|source| pins_error(&entry.path(), source))?;
        }
    }
    Ok(())
}
