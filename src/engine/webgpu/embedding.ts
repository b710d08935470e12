// Token and position embeddings on the GPU: the WebGPU counterparts of
// Kernels.embeddingForward and embeddingBackward (src/engine/kernels.ts).
// Tokens are uploaded once per batch with uploadTokens, which checks them
// against the vocabulary and lists, for each vocabulary row, the batch rows
// that hold it (a counting sort, O(rows + vocabulary)): the backward pass
// walks those lists (see embedding.wgsl.ts for why it gathers instead of
// scattering with atomics).
import { EMBEDDING_SPECS, EMBEDDING_WG } from './embedding.wgsl.ts';
import { createKernels, destroyKernels, uploadIndices, use, type GpuKernel, type GpuRef } from './program.ts';
import type { GpuArray } from './buffers.ts';

/** A batch of token ids on the GPU, with its rows grouped by token. */
export interface GpuTokens {
  /** the ids, int32, one per batch row (B·T) */
  ids: GpuArray;
  /** rowStart[v] .. rowStart[v + 1] index the rows of token v in rowList (V + 1 entries) */
  rowStart: GpuArray;
  /** batch rows grouped by token, increasing within each token */
  rowList: GpuArray;
  count: number;
  vocab: number;
  destroy(): void;
}

/** Uploads token ids (each in [0, vocab), else a RangeError) and their rows grouped by token. */
export function uploadTokens(device: GPUDevice, tokens: Int32Array, vocab: number): GpuTokens {
  const ids = uploadIndices(device, tokens, vocab, 'tokens');
  const rowStart = new Int32Array(vocab + 1);
  for (const t of tokens) rowStart[t + 1]++;
  for (let v = 0; v < vocab; v++) rowStart[v + 1] += rowStart[v];
  const next = rowStart.slice(0, vocab);
  const rowList = new Int32Array(tokens.length);
  tokens.forEach((t, r) => void (rowList[next[t]++] = r));
  const starts = uploadIndices(device, rowStart, tokens.length + 1, 'token row starts');
  const list = uploadIndices(device, rowList, tokens.length, 'token rows');
  return {
    ids, rowStart: starts, rowList: list, count: tokens.length, vocab,
    destroy(): void {
      for (const a of [ids, starts, list]) a.destroy();
    },
  };
}

type Name = keyof typeof EMBEDDING_SPECS;

export class GpuEmbedding {
  private constructor(private readonly kernels: Record<Name, GpuKernel>) {}

  static async create(device: GPUDevice, maxGroupsPerDimension?: number): Promise<GpuEmbedding> {
    return new GpuEmbedding(await createKernels(device, EMBEDDING_SPECS, maxGroupsPerDimension));
  }

  /** out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] */
  embeddingForward(out: GpuRef, tokens: GpuTokens, wte: GpuRef, wpe: GpuRef, B: number, T: number, C: number): void {
    const N = checkBatch(tokens, B, T);
    this.kernels.forward.run({
      uints: { N, T, C },
      arrays: { out: use(out, N * C), tokens: use(tokens.ids, N), wte: use(wte, tokens.vocab * C), wpe: use(wpe, T * C) },
      groups: Math.ceil((N * C) / EMBEDDING_WG),
    });
  }

  /** dwte, dwpe += from dout. Two dispatches, so dwte and dwpe may be windows of one buffer. */
  embeddingBackward(dwte: GpuRef, dwpe: GpuRef, dout: GpuRef, tokens: GpuTokens, B: number, T: number, C: number): void {
    const N = checkBatch(tokens, B, T), V = tokens.vocab;
    this.kernels.backwardWte.run({
      uints: { V, C },
      arrays: { dwte: use(dwte, V * C), dout: use(dout, N * C), rowStart: use(tokens.rowStart, V + 1), rowList: use(tokens.rowList, N) },
      groups: Math.ceil((V * C) / EMBEDDING_WG),
    });
    this.kernels.backwardWpe.run({
      uints: { B, T, C },
      arrays: { dwpe: use(dwpe, T * C), dout: use(dout, N * C) },
      groups: Math.ceil((T * C) / EMBEDDING_WG),
    });
  }

  destroy(): void {
    destroyKernels(this.kernels);
  }
}

function checkBatch(tokens: GpuTokens, B: number, T: number): number {
  if (tokens.count !== B * T) throw new RangeError(`embedding: ${tokens.count} tokens for B·T = ${B}·${T}`);
  return B * T;
}
