//! Compiles the eBPF mode's programs (`bpf/*.c`) with clang for the BPF target; the agent embeds
//! the objects (`src/ebpf/kernel.rs`), so a node needs no compiler.

use std::env;
use std::path::PathBuf;
use std::process::Command;

/// The programs, by file stem under `bpf/`.
const PROGRAMS: [&str; 2] = ["sock", "tc"];

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = env::var("SPLITPROXY_CLANG").unwrap_or_else(|_| "clang-19".to_owned());
    // The BPF target has no libc headers of its own: <linux/bpf.h> needs the host's <asm/types.h>.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets CARGO_CFG_TARGET_ARCH");
    let asm_include = format!("/usr/include/{arch}-linux-gnu");
    println!("cargo:rerun-if-env-changed=SPLITPROXY_CLANG");
    // Included by every program.
    println!("cargo:rerun-if-changed=bpf/services.h");
    for program in PROGRAMS {
        let source = format!("bpf/{program}.c");
        println!("cargo:rerun-if-changed={source}");
        let object = out_dir.join(format!("{program}.o"));
        let status = Command::new(&clang)
            .args([
                "-target",
                "bpf",
                "-O2",
                "-g",
                "-Wall",
                "-Werror",
                "-I",
                &asm_include,
                "-c",
            ])
            .arg(&source)
            .arg("-o")
            .arg(&object)
            .status()
            .unwrap_or_else(|err| {
                panic!(
                    "could not run {clang} to compile {source} ({err}): scripts/setup.sh \
                     installs clang-19 and libbpf-dev; SPLITPROXY_CLANG names another clang"
                )
            });
        assert!(status.success(), "{clang} could not compile {source}");
    }
}
