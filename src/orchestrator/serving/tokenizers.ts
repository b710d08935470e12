// The tokenizer of each served model (docs/inference.md, "Tokenizers"): the
// byte tokenizer for a model with no tokenizer bundle (the byte-level GPT),
// else the bundle's Hugging Face tokenizer, loaded once and kept (a few, by
// the model's sha256: a stored model never changes). Where a model's bundle is
// comes from the injected `TokenizerBundleLookup`: the model store's field.
import { gptConfigOf } from '../../model/model-ref.ts';
import { BYTE_TOKENIZER, tokenizerFromBundle, type ServingTokenizer, type TokenizerBundle } from '../../inference/tokenizer.ts';
import { readFileMetadata, TOKENIZER_KEY } from '../../model/hf/convert.ts';
import type { BlobStore } from '../blobs/blobs.ts';
import { OpenAiError } from './completion-request.ts';
import type { DeploymentRecord } from '../state/deployments.ts';

/**
 * THE HOOK: the tokenizer bundle of the stored model `sha256` (the blob's
 * bytes, or the parsed object `{ "tokenizer.json", "tokenizer_config.json",
 * "generation_config.json" }`), or null when the model has none (it is then
 * served with the byte tokenizer, and must have 256 tokens).
 */
export type TokenizerBundleLookup = (sha256: string) => Promise<Uint8Array | TokenizerBundle | null> | Uint8Array | TokenizerBundle | null;

/** Tokenizers kept loaded. */
const KEPT = 8;

export class ServingTokenizers {
  private readonly kept = new Map<string, Promise<ServingTokenizer>>();

  constructor(private readonly bundleOf: TokenizerBundleLookup = () => null) {}

  /** The tokenizer deployment `d`'s model is spoken to with; a 400 when it cannot be served as text. */
  async of(d: Pick<DeploymentRecord, 'sha256' | 'model' | 'name'>): Promise<ServingTokenizer> {
    const held = this.kept.get(d.sha256);
    if (held) {
      // most recently used last
      this.kept.delete(d.sha256);
      this.kept.set(d.sha256, held);
      return held;
    }
    const loading = this.load(d);
    this.kept.set(d.sha256, loading);
    // a failure is not kept: the next request asks again
    loading.catch(() => this.kept.get(d.sha256) === loading && this.kept.delete(d.sha256));
    while (this.kept.size > KEPT) this.kept.delete(this.kept.keys().next().value as string);
    return loading;
  }

  private async load(d: Pick<DeploymentRecord, 'sha256' | 'model' | 'name'>): Promise<ServingTokenizer> {
    const vocab = gptConfigOf(d.model).vocabSize;
    const bundle = await this.bundleOf(d.sha256);
    if (bundle === null) {
      if (vocab !== BYTE_TOKENIZER.vocabSize) throw new OpenAiError(400, `model '${d.name}' has a vocabulary of ${vocab} and no tokenizer: it is not a byte-level GPT, and nothing says how text becomes its tokens`, 'unsupported_model', 'model');
      return BYTE_TOKENIZER;
    }
    try {
      return tokenizerFromBundle(bundle, vocab);
    } catch (err) {
      throw new OpenAiError(500, `the tokenizer of model '${d.name}' does not load: ${(err as Error).message}`, 'tokenizer_error');
    }
  }
}

/**
 * The lookup the orchestrator serves with: an imported model's file carries
 * its tokenizer in its metadata (`tokenizer`, src/model/hf/convert.ts), so
 * the bundle is read from the stored blob's header alone (two range reads,
 * never the weights); a model whose file has none (the byte-level GPT) has
 * none. `OrchestratorOptions.tokenizerBundle` replaces it in tests.
 */
export function storedTokenizerBundle(models: { get(sha256: string): object | undefined }, blobs: Pick<BlobStore, 'getRange'>): TokenizerBundleLookup {
  return async (sha256) => {
    if (!models.get(sha256)) return null;
    const metadata = await readFileMetadata((start, end) => blobs.getRange(sha256, start, end), `model ${sha256.slice(0, 12)}`);
    const bundle = metadata[TOKENIZER_KEY];
    return bundle === undefined ? null : new TextEncoder().encode(bundle);
  };
}
