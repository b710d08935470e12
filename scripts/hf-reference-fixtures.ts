// Writes the PyTorch reference fixtures of test/fixtures/hf-reference/: for a
// random-weight Llama, Qwen2 and GPT-2 (test/helpers/hf-folder.ts, fixed
// seeds, so a test can make the same folders again) in F32 and BF16, the
// logits of every position of a prompt and the greedy continuation, computed
// by the independent implementation in scripts/hf_reference.py; and the same
// for random LoRA adapters in PEFT's layout over some of them (--adapter).
//   node --import tsx scripts/hf-reference-fixtures.ts --only lora   (the LoRA cases alone)
//   node --import tsx scripts/hf-reference-fixtures.ts   (needs python3 with torch)
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gptConfigOfDecoder, decoderConfigFromHf } from '../src/model/hf/decoder-config.ts';
import { LORA_REFERENCE_CASES, REFERENCE_CASES, REFERENCE_PROMPT, REFERENCE_GREEDY_STEPS, writeRandomAdapter } from '../test/helpers/hf-reference.ts';
import { writeRandomFolder } from '../test/helpers/hf-folder.ts';

/** The first python with torch: $NIMBLE_PYTHON, python3 on the PATH, Debian's /usr/bin/python3. */
function pythonWithTorch(): string {
  for (const py of [process.env.NIMBLE_PYTHON, 'python3', '/usr/bin/python3']) {
    if (!py) continue;
    try {
      execFileSync(py, ['-c', 'import torch'], { stdio: 'ignore' });
      return py;
    } catch {
      // not this one
    }
  }
  throw new Error('no python3 with torch: apt-get install -y python3-torch (or set NIMBLE_PYTHON)');
}
const python = pythonWithTorch();
const out = new URL('../test/fixtures/hf-reference/', import.meta.url).pathname;
mkdirSync(out, { recursive: true });
const tmp = mkdtempSync(join(tmpdir(), 'nimble-hf-ref-'));
const onlyLora = process.argv.includes('--only') && process.argv[process.argv.indexOf('--only') + 1] === 'lora';

/** Runs the reference on a folder (and adapter) and writes the fixture `name`. */
function reference(name: string, dir: string, adapter?: string): void {
  const args = [new URL('./hf_reference.py', import.meta.url).pathname, 'logits', dir, '--tokens', REFERENCE_PROMPT.join(','), '--greedy', String(REFERENCE_GREEDY_STEPS), ...(adapter ? ['--adapter', adapter] : [])];
  const json = execFileSync(python, args, { encoding: 'utf8', maxBuffer: 1 << 28 });
  const r = JSON.parse(json) as { logits: number[][]; greedy: number[]; torch: string };
  // 8 significant digits keep f32 values to well under 1e-6 of their size
  const logits = r.logits.map((row) => row.map((v) => Number(v.toPrecision(8))));
  writeFileSync(join(out, `${name}.json`), JSON.stringify({ case: name, torch: r.torch, tokens: REFERENCE_PROMPT, greedy: r.greedy, logits }) + '\n');
  console.log(`${name}: ${logits.length} × ${logits[0].length} logits, greedy ${r.greedy.slice(0, 8).join(',')}…`);
}

try {
  for (const c of REFERENCE_CASES) {
    const dir = join(tmp, c.name);
    writeRandomFolder(dir, c.hfConfig, { dtype: c.dtype, seed: c.seed, scale: c.scale });
    if (!onlyLora) reference(c.name, dir);
  }
  for (const c of LORA_REFERENCE_CASES) {
    const adapter = join(tmp, c.name);
    writeRandomAdapter(adapter, gptConfigOfDecoder(decoderConfigFromHf(c.base.hfConfig)), c);
    reference(c.name, join(tmp, c.base.name), adapter);
  }
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
