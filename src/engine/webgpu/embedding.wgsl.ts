// The WGSL of the embedding kernels (src/engine/webgpu/embedding.ts). The
// backward pass is a scatter-add (many rows add into one vocabulary row). It
// is written as a gather: one invocation per (vocabulary row, channel) walks
// the batch rows holding that token, in increasing row order (a list built
// on the CPU when the tokens are uploaded), and one invocation per (position,
// channel) walks b = 0..B−1. No two invocations write one element, so there
// are no atomics, and every element receives its terms in the order the WASM
// kernel adds them: the same bits as WASM, on any GPU, run after run.
import type { KernelSpec } from './program.ts';

export const EMBEDDING_WG = 256;

/** One invocation per element gid < p.<rows> · p.C, as row r and channel c. */
function perElement(label: string, rows: string, arrays: KernelSpec['arrays'], uints: string[], statements: string): KernelSpec {
  return {
    label,
    workgroupSize: EMBEDDING_WG,
    uints: [...uints, 'C'],
    arrays,
    body: `
  if (gid >= p.${rows} * p.C) { return; }
  let r = gid / p.C;
  let c = gid - r * p.C;
${statements}`,
  };
}

export const EMBEDDING_SPECS = {
  forward: perElement(
    'embeddingForward',
    'N',
    [{ name: 'out', write: true }, { name: 'tokens', type: 'u32' }, { name: 'wte' }, { name: 'wpe' }],
    ['N', 'T'],
    '  set_out(gid, wte(tokens(r) * p.C + c) + wpe((r % p.T) * p.C + c));',
  ),
  backwardWte: perElement(
    'embeddingBackwardWte',
    'V',
    [{ name: 'dwte', write: true }, { name: 'dout' }, { name: 'rowStart', type: 'u32' }, { name: 'rowList', type: 'u32' }],
    ['V'],
    `  var acc = dwte(gid);
  for (var j = rowStart(r); j < rowStart(r + 1u); j++) { acc += dout(rowList(j) * p.C + c); }
  set_dwte(gid, acc);`,
  ),
  backwardWpe: perElement(
    'embeddingBackwardWpe',
    'T',
    [{ name: 'dwpe', write: true }, { name: 'dout' }],
    ['B', 'T'],
    `  var acc = dwpe(gid);
  for (var b = 0u; b < p.B; b++) { acc += dout((b * p.T + r) * p.C + c); }
  set_dwpe(gid, acc);`,
  ),
} satisfies Record<string, KernelSpec>;
