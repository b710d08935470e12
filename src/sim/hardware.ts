// The hardware table the simulator draws miners from: classes of machines
// with their effective training speed, the memory they give a stage, their
// links, and how long they stay. `--hardware FILE` replaces it with a JSON
// table of the same shape (validated with the protocol's `parse`).
//
// Where the figures come from (effective = what training achieves, not the
// datasheet peak):
// - CPUs run this project's WASM SIMD engine. On this machine (2 threads) the
//   engine trains gpt-tiny at 10,959 tokens/s × 5.21 MFLOP/token ≈ 57
//   GFLOP/s (README, `gpt-tiny.train.tokens_per_s`), about 28 GFLOP/s per
//   core; an 8-core desktop ≈ 200, a 4-core laptop that throttles ≈ 80, a
//   browser tab given 2 worker threads ≈ 40.
// - GPUs: datasheet dense fp16/bf16 tensor throughput × 35-40% model FLOPs
//   utilization (typical of well-tuned transformer training): H100 SXM 989
//   TFLOP/s → 400 TFLOP/s; A100 312 → 125; RTX 4090 165 (fp32 accumulate)
//   → 58; RTX 3060 51 (fp16 accumulate; ~25 with fp32) → 9.
// - Memory for a stage: 90% of the GPU's memory (80, 80, 24, 12 GB); for CPUs
//   half the RAM of a 16 GB desktop, 8 GB laptop, and 2 GB for a tab
//   (browsers cap a tab's memory well below wasm64's limit).
// - Links: datacenters 10 Gbit/s symmetric, 10 ms to the internet core;
//   homes on cable/fibre 100 Mbit/s up (the "home link" of the study), 500
//   down, 20 ms; a typical consumer line 20 up / 200 down; laptops and tabs on
//   Wi-Fi 10 up / 100 down, 30 ms. A hop's latency is the sender's plus the
//   receiver's.
// - Sessions: rented datacenter GPUs are kept about a day (spot instances are
//   reclaimed sooner, reserved ones later); gaming PCs idle overnight ≈ 8 h;
//   desktops and laptops ≈ 6 and 3 h; a browser tab ≈ 30 min. The time to
//   leave is exponential with that mean (memoryless churn).
// - Shares: a volunteer population dominated by consumer machines.
import { Type, type Static } from '@sinclair/typebox';
import { readFileSync } from 'node:fs';
import { NimbleError } from '../protocol/errors.ts';
import { parse } from '../protocol/messages.ts';
import type { Rng } from './rng.ts';

const Positive = Type.Number({ exclusiveMinimum: 0, maximum: 1e12 });

/** One class of machines in the table. */
export const HardwareClass = Type.Object(
  {
    name: Type.String({ minLength: 1, maxLength: 64 }),
    /** share of the population drawn from this class (normalized over the table) */
    share: Positive,
    /** effective training GFLOP/s */
    gflops: Positive,
    /** memory the miner gives a stage, GB (1e9 bytes) */
    memoryGB: Positive,
    /** upload, Mbit/s */
    upMbps: Positive,
    /** download, Mbit/s */
    downMbps: Positive,
    /** one-way latency to the internet core, ms */
    latencyMs: Type.Number({ minimum: 0, maximum: 60_000 }),
    /** mean time a miner stays before it leaves, hours */
    sessionHours: Positive,
    /** exactly this many of the first miners are of this class (classes in table order); later ones are drawn by share */
    count: Type.Optional(Type.Integer({ minimum: 0, maximum: 1_000_000 })),
    /** share of the time the miner works (`nbcli miner start --throttle`): it rests (1 − t) ÷ t of each job's time after it; default 1 */
    throttle: Type.Optional(Type.Number({ exclusiveMinimum: 0, maximum: 1 })),
  },
  { additionalProperties: false },
);
export type HardwareClass = Static<typeof HardwareClass>;

export const HardwareTable = Type.Object({ classes: Type.Array(HardwareClass, { minItems: 1, maxItems: 100 }) }, { additionalProperties: false });
export type HardwareTable = Static<typeof HardwareTable>;

/** The documented table (see the file header for the reasoning behind each figure). */
export const DEFAULT_HARDWARE: HardwareTable = {
  classes: [
    { name: 'h100', share: 0.01, gflops: 400_000, memoryGB: 72, upMbps: 10_000, downMbps: 10_000, latencyMs: 10, sessionHours: 24 },
    { name: 'a100', share: 0.02, gflops: 125_000, memoryGB: 72, upMbps: 10_000, downMbps: 10_000, latencyMs: 10, sessionHours: 24 },
    { name: 'rtx4090', share: 0.1, gflops: 58_000, memoryGB: 21.6, upMbps: 100, downMbps: 500, latencyMs: 20, sessionHours: 8 },
    { name: 'rtx3060', share: 0.22, gflops: 9_000, memoryGB: 10.8, upMbps: 20, downMbps: 200, latencyMs: 20, sessionHours: 8 },
    { name: 'desktop-cpu', share: 0.25, gflops: 200, memoryGB: 8, upMbps: 20, downMbps: 200, latencyMs: 20, sessionHours: 6 },
    { name: 'laptop-cpu', share: 0.25, gflops: 80, memoryGB: 4, upMbps: 10, downMbps: 100, latencyMs: 30, sessionHours: 3 },
    { name: 'browser-tab', share: 0.15, gflops: 40, memoryGB: 2, upMbps: 10, downMbps: 100, latencyMs: 30, sessionHours: 0.5 },
  ],
};

/** Checks a table (schema and unique names); throws NimbleError 'invalid' naming what is wrong. */
export function validateHardwareTable(value: unknown, what = 'hardware table'): HardwareTable {
  const table = parse(HardwareTable, value, what);
  const seen = new Set<string>();
  for (const c of table.classes) {
    if (seen.has(c.name)) throw new NimbleError('invalid', `invalid ${what}: class '${c.name}' is listed twice`);
    seen.add(c.name);
  }
  return table;
}

/** Reads and validates a JSON hardware table (`--hardware FILE`). */
export function loadHardwareFile(path: string): HardwareTable {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new NimbleError('invalid', `cannot read hardware table ${path}: ${(err as Error).message}`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new NimbleError('invalid', `invalid hardware table ${path}: not JSON`);
  }
  return validateHardwareTable(value, `hardware table ${path}`);
}

/** A miner drawn from the table. */
export interface DrawnMiner {
  id: string;
  /** its class's name */
  hardware: string;
  gflops: number;
  memoryBytes: number;
  upMbps: number;
  downMbps: number;
  latencyMs: number;
  sessionHours: number;
  /** share of the time it works (HardwareClass.throttle) */
  throttle: number;
}

/** The class miner number `index` is by the classes' counts (none when the counts are used up). */
function countedClass(table: HardwareTable, index: number): HardwareClass | undefined {
  let left = index;
  for (const c of table.classes) {
    if (left < (c.count ?? 0)) return c;
    left -= c.count ?? 0;
  }
  return undefined;
}

/** The class of miner number `index` drawn with `rng` in proportion to the shares. */
export function drawMiner(table: HardwareTable, rng: Rng, index: number): DrawnMiner {
  const c = countedClass(table, index) ?? table.classes[rng.weighted(table.classes.map((k) => k.share))];
  return {
    id: `m${String(index).padStart(5, '0')}`,
    hardware: c.name,
    gflops: c.gflops,
    memoryBytes: Math.round(c.memoryGB * 1e9),
    upMbps: c.upMbps,
    downMbps: c.downMbps,
    latencyMs: c.latencyMs,
    sessionHours: c.sessionHours,
    throttle: c.throttle ?? 1,
  };
}
