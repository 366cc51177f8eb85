//! Rule rendering: a model and node options from the fuzzer's bytes, rendered for both families
//! over the chains of an earlier model's render, must give valid `iptables-restore` input.

#![no_main]

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use splitproxy_fuzz::{check_render, node_options, proxy_state};

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let (Ok(previous), Ok(state), Ok(options)) = (
        proxy_state(&mut u),
        proxy_state(&mut u),
        node_options(&mut u),
    ) else {
        return;
    };
    check_render(&previous, &state, &options);
});
