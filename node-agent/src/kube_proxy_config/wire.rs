//! `KubeProxyConfiguration` of `kubeproxy.config.k8s.io/v1alpha1` field for field, as the pinned
//! release (k8s.io/kube-proxy v0.36.3) spells it. Field names are case-sensitive and a field
//! this schema does not have is an error that names it (upstream only logs those).

use crate::duration::{format_duration, parse_duration};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use std::{collections::BTreeMap, time::Duration};

/// The configuration's `apiVersion`.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
/// The configuration's `kind`.
pub const KIND: &str = "KubeProxyConfiguration";

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
#[allow(missing_docs)] // Each field is upstream's field of the same name.
pub struct KubeProxyConfiguration {
    pub api_version: String,
    pub kind: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    pub client_connection: ClientConnection,
    pub logging: Logging,
    pub hostname_override: String,
    pub bind_address: String,
    pub healthz_bind_address: String,
    pub metrics_bind_address: String,
    pub bind_address_hard_fail: bool,
    pub enable_profiling: bool,
    pub show_hidden_metrics_for_version: String,
    pub mode: String,
    pub iptables: Iptables,
    pub ipvs: Ipvs,
    pub nftables: Nftables,
    pub winkernel: Winkernel,
    pub detect_local_mode: String,
    pub detect_local: DetectLocal,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: String,
    pub node_port_addresses: Option<Vec<String>>,
    pub oom_score_adj: Option<i32>,
    pub conntrack: Conntrack,
    pub config_sync_period: GoDuration,
    pub port_range: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub windows_run_as_service: bool,
}

/// `clientConnection`: how kube-proxy reaches the API server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
#[allow(missing_docs)]
pub struct ClientConnection {
    pub kubeconfig: String,
    pub accept_content_types: String,
    pub content_type: String,
    #[serde(serialize_with = "go_float")]
    pub qps: f32,
    pub burst: i32,
}

/// `logging`: component-base's `LoggingConfiguration`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
#[allow(missing_docs)]
pub struct Logging {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub format: String,
    pub flush_frequency: FlushFrequency,
    pub verbosity: u32,
    #[serde(rename = "vmodule", skip_serializing_if = "Vec::is_empty")]
    pub vmodule: Vec<VModuleItem>,
    pub options: FormatOptions,
}

/// One `logging.vmodule` entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
#[allow(missing_docs)]
pub struct VModuleItem {
    pub file_pattern: String,
    pub verbosity: u32,
}

/// `logging.options`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[allow(missing_docs)]
pub struct FormatOptions {
    pub text: OutputRouting,
    pub json: OutputRouting,
}

/// `logging.options.text` and `logging.options.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
#[allow(missing_docs)]
pub struct OutputRouting {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub split_stream: bool,
    pub info_buffer_size: Quantity,
}

/// `iptables`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
#[allow(missing_docs)]
pub struct Iptables {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: bool,
    pub localhost_node_ports: Option<bool>,
    pub sync_period: GoDuration,
    pub min_sync_period: GoDuration,
}

/// `ipvs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
#[allow(missing_docs)]
pub struct Ipvs {
    pub sync_period: GoDuration,
    pub min_sync_period: GoDuration,
    pub scheduler: String,
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Option<Vec<String>>,
    #[serde(rename = "strictARP")]
    pub strict_arp: bool,
    pub tcp_timeout: GoDuration,
    pub tcp_fin_timeout: GoDuration,
    pub udp_timeout: GoDuration,
}

/// `nftables`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
#[allow(missing_docs)]
pub struct Nftables {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: bool,
    pub sync_period: GoDuration,
    pub min_sync_period: GoDuration,
}

/// `winkernel`: Windows only, read and kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
#[allow(missing_docs)]
pub struct Winkernel {
    pub network_name: String,
    pub source_vip: String,
    #[serde(rename = "enableDSR")]
    pub enable_dsr: bool,
    pub root_hns_endpoint_name: String,
    pub forward_health_check_vip: bool,
}

/// `detectLocal`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
#[allow(missing_docs)]
pub struct DetectLocal {
    pub bridge_interface: String,
    pub interface_name_prefix: String,
}

/// `conntrack`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
#[allow(missing_docs)]
pub struct Conntrack {
    pub max_per_core: Option<i32>,
    pub min: Option<i32>,
    pub tcp_established_timeout: Option<GoDuration>,
    pub tcp_close_wait_timeout: Option<GoDuration>,
    pub tcp_be_liberal: bool,
    pub udp_timeout: GoDuration,
    pub udp_stream_timeout: GoDuration,
}

/// A `metav1.Duration`: Go's duration text (`30s`, `1h0m0s`). Negative durations do not parse:
/// no field of this schema accepts one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

impl GoDuration {
    /// Whether it is zero, which upstream reads as unset.
    #[must_use]
    pub fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_duration(&text)
            .map(GoDuration)
            .map_err(|err| de::Error::custom(format!("{text:?}: {err}")))
    }
}

/// `logging.flushFrequency`: a duration, or a number of nanoseconds; written back in the form
/// it was read in (a default is written as text), as upstream's `TimeOrMetaDuration`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushFrequency {
    /// The duration.
    pub duration: Duration,
    /// Whether it was a number of nanoseconds.
    pub nanoseconds: bool,
}

impl Serialize for FlushFrequency {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.nanoseconds {
            let nanos = u64::try_from(self.duration.as_nanos()).unwrap_or(u64::MAX);
            serializer.serialize_u64(nanos)
        } else {
            GoDuration(self.duration).serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for FlushFrequency {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Nanoseconds(u64),
            Text(GoDuration),
        }
        match Either::deserialize(deserializer) {
            Ok(Either::Nanoseconds(nanos)) => Ok(Self {
                duration: Duration::from_nanos(nanos),
                nanoseconds: nanos != 0,
            }),
            Ok(Either::Text(GoDuration(duration))) => Ok(Self {
                duration,
                nanoseconds: false,
            }),
            Err(_) => Err(de::Error::custom(
                "expected a duration (e.g. 5s) or a number of nanoseconds",
            )),
        }
    }
}

/// A resource quantity (`0`, `64Ki`), kept as written: only the logger's buffering reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity(pub String);

impl Default for Quantity {
    fn default() -> Self {
        Self("0".to_owned())
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Number(u64),
            Text(String),
        }
        let text = match Either::deserialize(deserializer) {
            Ok(Either::Number(number)) => number.to_string(),
            Ok(Either::Text(text)) => text,
            Err(_) => return Err(de::Error::custom("expected a quantity (e.g. 0, 64Ki)")),
        };
        let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let suffix = &text[digits.len()..];
        let known = [
            "", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
        ];
        if digits.is_empty() || digits.parse::<f64>().is_err() || !known.contains(&suffix) {
            return Err(de::Error::custom(format!(
                "{text:?} is not a quantity (e.g. 0, 64Ki)"
            )));
        }
        Ok(Self(text))
    }
}

/// Writes a whole float as Go does (`5`, not `5.0`).
#[allow(clippy::trivially_copy_pass_by_ref)] // serde's signature
fn go_float<S: Serializer>(value: &f32, serializer: S) -> Result<S::Ok, S::Error> {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        #[allow(clippy::cast_possible_truncation)] // whole and in range, checked above
        serializer.serialize_i64(*value as i64)
    } else {
        serializer.serialize_f64(f64::from(*value))
    }
}
