//! `--otlp-*` options and the standard `OTEL_*` environment variables, resolved into one export configuration.
//!
//! Owns precedence, defaults and validation; never opens a connection. Precedence, highest first:
//! - endpoint: `--otlp-endpoint`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is), `OTEL_EXPORTER_OTLP_ENDPOINT`
//!   (a base URL: for HTTP, `/v1/traces` is appended). None of them set: no export.
//! - protocol: `--otlp-protocol`, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, `OTEL_EXPORTER_OTLP_PROTOCOL`
//!   (`grpc`, `http/protobuf`; `http` accepted), then the endpoint's port: 4317 (the OTLP/gRPC port) means
//!   gRPC, anything else HTTP/protobuf (the specification's default protocol).
//! - `service.name`: `OTEL_SERVICE_NAME`, `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, then `llmserve`.
//! - other resource attributes: `OTEL_RESOURCE_ATTRIBUTES` (`k=v,k2=v2`, values percent-decoded) over what
//!   llmprof detects.
//!
//! - TLS (https:// endpoints only): `--otlp-ca-cert`, `--otlp-client-cert`, `--otlp-client-key`, then
//!   `OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE`/`..._CLIENT_CERTIFICATE`/`..._CLIENT_KEY`, then the same without
//!   `TRACES_`. The system roots are always trusted too.
//!
//! `OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`, `..._COMPRESSION` are read by opentelemetry-otlp itself.

use super::OtelError;

/// `--otlp-endpoint` given as a bare base URL is completed with this path for OTLP/HTTP (OTLP specification,
/// "OTLP/HTTP Request": the default traces path).
pub const HTTP_TRACES_PATH: &str = "/v1/traces";
/// Default OTLP/gRPC port (OTLP specification); an endpoint on it defaults to gRPC.
pub const GRPC_DEFAULT_PORT: u16 = 4317;

/// OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (usually port 4317).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (usually port 4318, path /v1/traces).
    #[value(alias = "http/protobuf")]
    Http,
}

/// Command-line options of the OTel span export (flatten into a subcommand with `#[command(flatten)]`).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct OtelOptions {
    /// Export one span per request (GenAI semantic conventions) to this OTLP endpoint, e.g.
    /// http://127.0.0.1:4317 (gRPC) or http://127.0.0.1:4318 (HTTP). Default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    /// then $OTEL_EXPORTER_OTLP_ENDPOINT; without any, no spans are exported.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport. Default: $OTEL_EXPORTER_OTLP_PROTOCOL, else grpc for port 4317 and http otherwise.
    #[arg(long, value_enum, value_name = "PROTOCOL")]
    pub otlp_protocol: Option<OtlpProtocol>,
    /// PEM CA certificate(s) to trust, besides the system roots, for an https:// endpoint.
    /// Default: $OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE, then $OTEL_EXPORTER_OTLP_CERTIFICATE.
    #[arg(long, value_name = "FILE")]
    pub otlp_ca_cert: Option<std::path::PathBuf>,
    /// PEM client certificate for mutual TLS to an https:// endpoint (with --otlp-client-key).
    /// Default: $OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE, then $OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE.
    #[arg(long, value_name = "FILE")]
    pub otlp_client_cert: Option<std::path::PathBuf>,
    /// PEM private key of --otlp-client-cert.
    /// Default: $OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY, then $OTEL_EXPORTER_OTLP_CLIENT_KEY.
    #[arg(long, value_name = "FILE")]
    pub otlp_client_key: Option<std::path::PathBuf>,
    /// Put prompt and completion text in the request spans (`gen_ai.input.messages`/`gen_ai.output.messages`,
    /// first 4 KiB of each). Off by default: without it the engine's content probe is not even attached, so no
    /// text leaves the engine; spans carry token counts and timings only. Never written to the trace file.
    #[arg(long)]
    pub capture_content: bool,
}

/// The resolved export configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportConfig {
    /// Full endpoint URL (for HTTP, including the traces path).
    pub endpoint: String,
    /// Transport.
    pub protocol: OtlpProtocol,
    /// `service.name` of the resource.
    pub service_name: String,
    /// Attributes from `OTEL_RESOURCE_ATTRIBUTES`, in order (without `service.name`, which is in `service_name`).
    pub resource_attributes: Vec<(String, String)>,
    /// `--capture-content`.
    pub capture_content: bool,
    /// TLS files (used for https:// endpoints only).
    pub tls: super::tls::TlsFiles,
}

impl OtelOptions {
    /// Resolves against the process environment. `Ok(None)`: no endpoint configured, export is off.
    pub fn resolve(&self) -> Result<Option<ExportConfig>, OtelError> {
        self.resolve_with(|k| std::env::var(k).ok())
    }

    /// Resolves against an environment given as a lookup function (tests pass a map).
    pub fn resolve_with(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<ExportConfig>, OtelError> {
        let env = |k: &str| env(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        // (url, is a base URL to complete with the traces path)
        let (url, is_base) = match (
            &self.otlp_endpoint,
            env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            env("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(u), _, _) => (u.trim().to_string(), true),
            (None, Some(u), _) => (u, false),
            (None, None, Some(u)) => (u, true),
            (None, None, None) => return Ok(None),
        };
        let parsed = parse_url(&url)?;
        let protocol = match self.otlp_protocol {
            Some(p) => p,
            None => match env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
            {
                Some(p) => parse_protocol(&p)?,
                None if parsed.port == Some(GRPC_DEFAULT_PORT) => OtlpProtocol::Grpc,
                None => OtlpProtocol::Http,
            },
        };
        let endpoint = match protocol {
            OtlpProtocol::Http if is_base && !parsed.path.ends_with(HTTP_TRACES_PATH) => {
                format!("{}{}", url.trim_end_matches('/'), HTTP_TRACES_PATH)
            }
            _ => url,
        };
        let mut resource_attributes = match env("OTEL_RESOURCE_ATTRIBUTES") {
            Some(s) => parse_resource_attributes(&s),
            None => Vec::new(),
        };
        let attr_service = resource_attributes
            .iter()
            .rev()
            .find(|(k, _)| k == super::semconv::SERVICE_NAME)
            .map(|(_, v)| v.clone());
        resource_attributes.retain(|(k, _)| k != super::semconv::SERVICE_NAME);
        let service_name = env("OTEL_SERVICE_NAME")
            .or(attr_service)
            .unwrap_or_else(|| super::semconv::DEFAULT_SERVICE_NAME.to_string());
        let file = |flag: &Option<std::path::PathBuf>, var: &str| {
            flag.clone().or_else(|| {
                env(&format!("OTEL_EXPORTER_OTLP_TRACES_{var}"))
                    .or_else(|| env(&format!("OTEL_EXPORTER_OTLP_{var}")))
                    .map(std::path::PathBuf::from)
            })
        };
        let tls = super::tls::TlsFiles {
            ca: file(&self.otlp_ca_cert, "CERTIFICATE"),
            client_cert: file(&self.otlp_client_cert, "CLIENT_CERTIFICATE"),
            client_key: file(&self.otlp_client_key, "CLIENT_KEY"),
        };
        Ok(Some(ExportConfig {
            endpoint,
            protocol,
            service_name,
            resource_attributes,
            capture_content: self.capture_content,
            tls,
        }))
    }
}

/// The parts of an endpoint URL the resolution needs.
struct ParsedUrl {
    port: Option<u16>,
    path: String,
}

/// Checks `scheme://host[:port][/path]` with scheme http or https.
fn parse_url(url: &str) -> Result<ParsedUrl, OtelError> {
    let bad = |reason: &str| OtelError::InvalidEndpoint {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| bad("it must start with http:// or https://"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err(bad("it has no host"));
    }
    // `[::1]:4317`, `host:4317`, `host`
    let port = match authority.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') && !port.contains(']') => Some(
            port.parse::<u16>()
                .map_err(|_| bad("its port is not a number from 0 to 65535"))?,
        ),
        _ => None,
    };
    Ok(ParsedUrl {
        port,
        path: path.to_string(),
    })
}

/// Parses an `OTEL_EXPORTER_OTLP_PROTOCOL` value.
fn parse_protocol(s: &str) -> Result<OtlpProtocol, OtelError> {
    match s {
        "grpc" => Ok(OtlpProtocol::Grpc),
        "http/protobuf" | "http" => Ok(OtlpProtocol::Http),
        other => Err(OtelError::InvalidProtocol(other.to_string())),
    }
}

/// Parses `OTEL_RESOURCE_ATTRIBUTES` (`key1=value1,key2=value2`, values percent-encoded per the OTel
/// specification); entries without `=` or with an empty key are skipped.
pub fn parse_resource_attributes(s: &str) -> Vec<(String, String)> {
    s.split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            let k = k.trim();
            if k.is_empty() {
                return None;
            }
            Some((k.to_string(), percent_decode(v.trim())))
        })
        .collect()
}

/// Decodes `%XX` escapes (invalid escapes are kept as written; invalid UTF-8 is replaced).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve(opts: &OtelOptions, env: &[(&str, &str)]) -> Result<Option<ExportConfig>, OtelError> {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        opts.resolve_with(|k| env.get(k).cloned())
    }

    #[test]
    fn no_endpoint_means_no_export() {
        assert_eq!(resolve(&OtelOptions::default(), &[]).unwrap(), None);
        assert_eq!(
            resolve(&OtelOptions::default(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]).unwrap(),
            None
        );
    }

    #[test]
    fn flag_beats_env_and_port_4317_means_grpc() {
        let opts = OtelOptions {
            otlp_endpoint: Some("http://127.0.0.1:4317".into()),
            ..Default::default()
        };
        let c = resolve(&opts, &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://10.0.0.1:4318")])
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:4317");
        assert_eq!(c.protocol, OtlpProtocol::Grpc);
        assert_eq!(c.service_name, "llmserve");
    }

    #[test]
    fn http_base_url_gets_traces_path_but_signal_url_is_kept() {
        let c = resolve(
            &OtelOptions::default(),
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318/")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.protocol, OtlpProtocol::Http);
        assert_eq!(c.endpoint, "http://localhost:4318/v1/traces");
        let c = resolve(
            &OtelOptions::default(),
            &[
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://localhost:9999/custom",
                ),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint, "http://localhost:9999/custom");
        let opts = OtelOptions {
            otlp_endpoint: Some("http://[::1]:4318/v1/traces".into()),
            otlp_protocol: Some(OtlpProtocol::Http),
            ..Default::default()
        };
        assert_eq!(
            resolve(&opts, &[]).unwrap().unwrap().endpoint,
            "http://[::1]:4318/v1/traces"
        );
    }

    #[test]
    fn protocol_env_and_errors() {
        let c = resolve(
            &OtelOptions::default(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:5555"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.protocol, OtlpProtocol::Grpc);
        assert_eq!(c.endpoint, "http://127.0.0.1:5555");
        let e = resolve(
            &OtelOptions::default(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:1"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ],
        );
        assert!(matches!(e, Err(OtelError::InvalidProtocol(p)) if p == "http/json"));
        let opts = OtelOptions {
            otlp_endpoint: Some("127.0.0.1:4317".into()),
            ..Default::default()
        };
        assert!(matches!(
            resolve(&opts, &[]),
            Err(OtelError::InvalidEndpoint { .. })
        ));
        let opts = OtelOptions {
            otlp_endpoint: Some("http://h:99999".into()),
            ..Default::default()
        };
        assert!(matches!(
            resolve(&opts, &[]),
            Err(OtelError::InvalidEndpoint { .. })
        ));
    }

    #[test]
    fn tls_files_flag_then_traces_variable_then_general_variable() {
        let opts = OtelOptions {
            otlp_endpoint: Some("https://collector:4317".into()),
            otlp_ca_cert: Some("/flag/ca.pem".into()),
            ..Default::default()
        };
        let c = resolve(
            &opts,
            &[
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/env/ca.pem"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
                    "/traces/client.pem",
                ),
                ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/env/client.pem"),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/env/client.key"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.tls.ca.as_deref(), Some(std::path::Path::new("/flag/ca.pem")));
        assert_eq!(
            c.tls.client_cert.as_deref(),
            Some(std::path::Path::new("/traces/client.pem"))
        );
        assert_eq!(
            c.tls.client_key.as_deref(),
            Some(std::path::Path::new("/env/client.key"))
        );
    }

    #[test]
    fn service_name_and_resource_attributes() {
        let opts = OtelOptions {
            otlp_endpoint: Some("http://127.0.0.1:4318".into()),
            ..Default::default()
        };
        let c = resolve(
            &opts,
            &[(
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=gw, deployment.environment.name=prod%20eu,bad",
            )],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.service_name, "gw");
        assert_eq!(
            c.resource_attributes,
            vec![("deployment.environment.name".to_string(), "prod eu".to_string())]
        );
        let c = resolve(
            &opts,
            &[
                ("OTEL_RESOURCE_ATTRIBUTES", "service.name=gw"),
                ("OTEL_SERVICE_NAME", "llm-7"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.service_name, "llm-7");
    }

    #[test]
    fn percent_decoding_keeps_invalid_escapes() {
        assert_eq!(percent_decode("a%2Cb%zz%4"), "a,b%zz%4");
    }
}
