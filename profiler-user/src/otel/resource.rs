//! The OTel resource of exported spans: which service, host, process and GPU they describe.
//!
//! Owns the merge of what llmprof knows about the traced engine ([`ResourceInfo`]) with the user's
//! `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME` (already resolved in [`ExportConfig`]). Later sources win:
//! detected attributes, then `OTEL_RESOURCE_ATTRIBUTES`, then the service name.

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;

use super::options::ExportConfig;
use super::semconv as sc;

/// What llmprof knows about the traced engine process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceInfo {
    /// Process id of the engine.
    pub pid: u32,
    /// The engine's executable: a path (`/usr/bin/llmserve`) or a bare name (`llmserve`).
    pub executable: String,
    /// Host name.
    pub host: String,
    /// UUID of the engine's GPU, when known (e.g. `GPU-5c1f...` from NVML).
    pub gpu_uuid: Option<String>,
}

impl ResourceInfo {
    /// What /proc tells about process `pid`: its executable (the `/proc/<pid>/exe` link, else its `comm`) and
    /// the host name (`/proc/sys/kernel/hostname`). Fields that cannot be read stay empty.
    pub fn from_proc(pid: u32, gpu_uuid: Option<String>) -> Self {
        let executable = std::fs::read_link(format!("/proc/{pid}/exe"))
            .map(|p| p.to_string_lossy().into_owned())
            .or_else(|_| std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim().to_string()))
            .unwrap_or_default();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Self {
            pid,
            executable,
            host,
            gpu_uuid,
        }
    }
}

/// The resource attributes, in the order they are applied (a later key overrides an earlier one).
pub fn resource_attributes(cfg: &ExportConfig, info: &ResourceInfo) -> Vec<KeyValue> {
    let mut attrs = Vec::new();
    if !info.host.is_empty() {
        attrs.push(KeyValue::new(sc::HOST_NAME, info.host.clone()));
    }
    if info.pid != 0 {
        attrs.push(KeyValue::new(sc::PROCESS_PID, i64::from(info.pid)));
    }
    if !info.executable.is_empty() {
        let name = info.executable.rsplit('/').next().unwrap_or(&info.executable);
        attrs.push(KeyValue::new(sc::PROCESS_EXECUTABLE_NAME, name.to_string()));
        if info.executable.contains('/') {
            attrs.push(KeyValue::new(
                sc::PROCESS_EXECUTABLE_PATH,
                info.executable.clone(),
            ));
        }
    }
    attrs.push(KeyValue::new(sc::LLMPROF_VERSION, env!("CARGO_PKG_VERSION")));
    if let Some(gpu) = info.gpu_uuid.as_ref().filter(|g| !g.is_empty()) {
        attrs.push(KeyValue::new(sc::LLMPROF_GPU_UUID, gpu.clone()));
    }
    attrs.extend(
        cfg.resource_attributes
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
    );
    attrs.push(KeyValue::new(sc::SERVICE_NAME, cfg.service_name.clone()));
    attrs
}

/// The OTel resource (no SDK detectors: everything comes from [`resource_attributes`]).
pub fn build_resource(cfg: &ExportConfig, info: &ResourceInfo) -> Resource {
    Resource::builder_empty()
        .with_attributes(resource_attributes(cfg, info))
        .build()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;
    use crate::otel::options::OtlpProtocol;
    use opentelemetry::{Key, Value};

    #[test]
    fn from_proc_names_this_process() {
        let me = ResourceInfo::from_proc(std::process::id(), None);
        let exe = std::env::current_exe().unwrap();
        assert_eq!(me.executable, exe.to_string_lossy());
        assert!(!me.host.is_empty());
    }

    #[test]
    fn user_attributes_override_detected_ones() {
        let cfg = ExportConfig {
            endpoint: "http://127.0.0.1:4318/v1/traces".into(),
            protocol: OtlpProtocol::Http,
            service_name: "llm-7".into(),
            resource_attributes: vec![("host.name".into(), "gpu-node-7".into())],
            capture_content: false,
            tls: Default::default(),
        };
        let info = ResourceInfo {
            pid: 4242,
            executable: "/opt/llm/bin/llmserve".into(),
            host: "ip-10-0-0-7".into(),
            gpu_uuid: Some("GPU-1234".into()),
        };
        let r = build_resource(&cfg, &info);
        let get = |k: &'static str| r.get(&Key::from_static_str(k));
        assert_eq!(get("host.name"), Some(Value::from("gpu-node-7")));
        assert_eq!(get("service.name"), Some(Value::from("llm-7")));
        assert_eq!(get("process.pid"), Some(Value::I64(4242)));
        assert_eq!(get("process.executable.name"), Some(Value::from("llmserve")));
        assert_eq!(
            get("process.executable.path"),
            Some(Value::from("/opt/llm/bin/llmserve"))
        );
        assert_eq!(get("llmprof.gpu.uuid"), Some(Value::from("GPU-1234")));
        assert_eq!(
            get("llmprof.version"),
            Some(Value::from(env!("CARGO_PKG_VERSION")))
        );
    }
}
