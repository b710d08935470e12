// The data of a run as the orchestrator reads it, for the work it verifies
// (spot checks) and the checkpoints it evaluates: a GPT run's corpus (a named
// corpus, or an uploaded dataset, `sha256:…`, read from the blob store and
// checked against its id; never a path), and the SpamAssassin features an
// MLP run trains on. One instance per orchestrator (the Coordinator's), so
// both users share its caches.
import type { ByteCorpus } from '../../data/corpus.ts';
import { datasetCorpus, datasetHex, isDatasetId, loadNamedCorpus } from '../../data/dataset.ts';
import { loadSpamDatasetAsync, type SpamDataset } from '../../data/spam.ts';
import type { BlobStore } from '../blobs/blobs.ts';
import { remember } from '../cache.ts';

/** Corpora kept (an uploaded dataset may have 256 MiB). */
const CORPUS_ENTRIES = 2;

export class RunData {
  private readonly corpora = new Map<string, ByteCorpus | null>();
  /** corpora being loaded: concurrent callers share one load */
  private readonly loading = new Map<string, Promise<ByteCorpus | null>>();

  constructor(
    /** where uploaded datasets (`sha256:` run data) are read from; without it they cannot be loaded */
    private readonly blobs: Pick<BlobStore, 'get'> | null = null,
  ) {}

  /**
   * The corpus of a run's data (`run.data`): a named corpus, or an uploaded
   * dataset read from the blob store and checked against its id; never a
   * path. Null when it cannot be loaded (a dataset is tried again at the
   * next call; anything else is remembered as not loadable).
   */
  corpus(spec: string): Promise<ByteCorpus | null> {
    const kept = this.corpora.get(spec);
    if (kept !== undefined) return Promise.resolve(kept);
    let p = this.loading.get(spec);
    if (!p) {
      p = this.load(spec).finally(() => this.loading.delete(spec));
      this.loading.set(spec, p);
    }
    return p;
  }

  private async load(spec: string): Promise<ByteCorpus | null> {
    let corpus: ByteCorpus | null = null;
    try {
      if (!isDatasetId(spec)) corpus = loadNamedCorpus(spec);
      else if (this.blobs) corpus = datasetCorpus(spec, await this.blobs.get(datasetHex(spec)));
    } catch {
      corpus = null;
    }
    if (corpus || !isDatasetId(spec)) remember(this.corpora, spec, corpus, CORPUS_ENTRIES);
    return corpus;
  }

  /**
   * The SpamAssassin features with `inputs` buckets, built on first use
   * (about 1.4 s of work for 4,096 buckets, in slices that let the
   * orchestrator serve meanwhile; once per process: src/data/spam.ts keeps
   * it); null when it cannot be built.
   */
  async spamDataset(inputs: number): Promise<SpamDataset | null> {
    try {
      return await loadSpamDatasetAsync(inputs);
    } catch {
      return null;
    }
  }
}
