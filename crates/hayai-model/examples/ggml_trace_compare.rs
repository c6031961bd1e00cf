//! Compares the ggml-exact forward ([`hayai_model::ggml`]) with a llama.cpp trace written by
//! `scripts/llama_cpp_trace.cpp`, call by call and tensor by tensor, and prints where the two
//! first differ. The calls are replayed as the trace made them: the prompt as one batch, then
//! each greedy token alone.
//!
//! Usage: ggml_trace_compare MODEL.gguf TRACE.bin PROMPT_IDS(comma separated) [--all]

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context, Result};
use half::f16;
use hayai_model::ggml::GgmlGemma3;
use hayai_model::{argmax, Rows};

struct Record {
    call: u32,
    name: String,
    data: Vec<f32>,
}

struct Cursor {
    buf: Vec<u8>,
    at: usize,
}

impl Cursor {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.at + n > self.buf.len() {
            bail!("truncated trace at byte {}", self.at);
        }
        self.at += n;
        Ok(&self.buf[self.at - n..self.at])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into()?))
    }
    fn string(&mut self) -> Result<String> {
        let n = self.u32()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
}

fn read_trace(path: &Path) -> Result<Vec<Record>> {
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .with_context(|| format!("open {}", path.display()))?
        .read_to_end(&mut buf)?;
    let mut c = Cursor { buf, at: 0 };
    let mut out = Vec::new();
    while c.at < c.buf.len() {
        if c.u32()? != 0x4544_4f4e {
            bail!("bad record magic at byte {}", c.at - 4);
        }
        let call = c.u32()?;
        let name = c.string()?;
        let _op = c.string()?;
        for _ in 0..c.u32()? {
            c.string()?;
        }
        let ty = c.u32()?;
        c.take(32)?;
        let nb = u64::from_le_bytes(c.take(8)?.try_into()?) as usize;
        let raw = c.take(nb)?;
        let data = match ty {
            0 => raw
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect(),
            1 => raw
                .chunks_exact(2)
                .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
            _ => continue,
        };
        out.push(Record { call, name, data });
    }
    Ok(out)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        bail!("usage: ggml_trace_compare MODEL.gguf TRACE.bin PROMPT_IDS [--all]");
    }
    let show_all = args.iter().any(|a| a == "--all");
    let prompt: Vec<u32> = args[3]
        .split(',')
        .map(|s| s.trim().parse().context("prompt id"))
        .collect::<Result<_>>()?;
    let records = read_trace(Path::new(&args[2]))?;
    let n_calls = records.iter().map(|r| r.call + 1).max().unwrap_or(0);
    let mut model = GgmlGemma3::open(Path::new(&args[1]))?;
    let mut feed = prompt.clone();
    let mut first_bad: Option<(u32, String)> = None;
    for call in 0..n_calls {
        // The last record of each name in this call (names repeat for views of one value).
        let mut theirs: HashMap<&str, &Vec<f32>> = HashMap::new();
        for r in records.iter().filter(|r| r.call == call) {
            theirs.insert(r.name.as_str(), &r.data);
        }
        let (logits, trace) = model.forward_traced(&feed, Rows::Last)?;
        let mut bad_here = 0;
        let mut lines = Vec::new();
        let ours = trace
            .iter()
            .map(|(n, v)| (n.as_str(), v))
            .chain(std::iter::once(("result_logits", &logits)));
        for (name, v) in ours {
            let Some(t) = theirs.get(name) else {
                lines.push(format!("  {name}: not in the trace"));
                continue;
            };
            if t.len() != v.len() {
                lines.push(format!("  {name}: length {} vs {}", v.len(), t.len()));
                continue;
            }
            let diff = v
                .iter()
                .zip(t.iter())
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            let max = v
                .iter()
                .zip(t.iter())
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            if diff > 0 {
                bad_here += 1;
                if first_bad.is_none() {
                    first_bad = Some((call, name.to_string()));
                }
            }
            if diff > 0 || show_all {
                lines.push(format!(
                    "  {name}: {diff}/{} differ, max |diff| {max:.3e}",
                    v.len()
                ));
            }
        }
        let next = argmax(&logits);
        println!(
            "call {call} ({} tokens): {} tensors differ; next token {next}",
            feed.len(),
            bad_here
        );
        for l in lines.iter().take(if show_all { usize::MAX } else { 12 }) {
            println!("{l}");
        }
        feed = vec![next];
    }
    match first_bad {
        None => println!("bit-identical to the trace in every compared tensor"),
        Some((c, n)) => println!("first difference: call {c}, {n}"),
    }
    Ok(())
}
