// A miner's deployment stage (docs/inference.md, "Deploy"): the orchestrator
// names one in a heartbeat reply (a DeploymentAssignment); the miner
// downloads the model's file from the orchestrator's model store (resumable,
// into <dataDir>/models/<sha256>.safetensors, shared by the miners of a data
// dir), checks its sha256 against the ModelRegistry on its own chain
// (src/inference/verify.ts; an unpaid network: the assignment's sha256 only),
// loads the stage's parts into a StageInference and reports `serving`. A file
// that does not verify, or weights that do not load, are refused and reported
// `failed`: nothing is served from weights that were not checked. Heartbeats
// go on while this runs in the background.
//
// `served()` is what the request path uses: the loaded StageInference of the
// stage, with the assignment it serves.
import { existsSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { downloadVerified, sha256OfFile } from '../api/download.ts';
import type { Engine } from '../engine/engine.ts';
import { inferenceFromFile } from '../inference/load.ts';
import type { StageInference } from '../inference/stage-inference.ts';
import { checkModelFile, type RegistryLookup, type VerifiedBy } from '../inference/verify.ts';
import { gptConfigOf } from '../model/model-ref.ts';
import { wholeModelRef } from '../model/whole-model.ts';
import { NimbleError } from '../protocol/errors.ts';
import type { DeploymentAssignment, DeploymentReport } from '../protocol/messages.ts';

/** A stage this miner serves: loaded from weights it checked. */
export interface ServedStage {
  assignment: DeploymentAssignment;
  inference: StageInference;
  /** the sha256 of the file the weights were loaded from */
  sha256: string;
  verifiedBy: VerifiedBy;
}

export interface DeploymentServingOptions {
  engine: Engine;
  /** where model files are kept */
  dir: string;
  /** this miner's address (names its partial downloads, so miners sharing `dir` never write the same file) */
  address: string;
  /** the model's file in the orchestrator's store, from `offset` on (GET /models/:sha256/file with a range) */
  open: (sha256: string, offset: number, signal?: AbortSignal) => Promise<Response>;
  /** the ModelRegistry on the miner's chain (null: the miner has no chain) */
  lookup: RegistryLookup | null;
  log: (line: string) => void;
  /** tries of a download cut short before the stage is reported failed (default 4) */
  downloadTries?: number;
}

interface Holding {
  assignment: DeploymentAssignment;
  state: 'loading' | 'serving' | 'failed';
  detail?: string;
  served?: ServedStage;
  abort: AbortController;
}

export class DeploymentServing {
  private holding: Holding | null = null;
  private loading: Promise<void> | null = null;

  constructor(private readonly options: DeploymentServingOptions) {}

  /** Takes on, keeps or lets go of the deployment stage a heartbeat reply names (null or absent: none). */
  follow(a: DeploymentAssignment | null | undefined): void {
    const h = this.holding;
    if (h && a && sameStage(h.assignment, a)) {
      // the same stage: only its neighbours may have changed
      h.assignment = a;
      if (h.served) h.served.assignment = a;
      return;
    }
    if (h) this.release(h);
    if (!a) return;
    const next: Holding = { assignment: a, state: 'loading', abort: new AbortController() };
    this.holding = next;
    this.options.log(`deployment ${a.deploymentId}: holding stage ${a.stage} [${a.from}, ${a.to}) of model ${a.sha256.slice(0, 12)}; downloading and checking its weights`);
    this.loading = this.load(next)
      .then((served) => {
        if (this.holding !== next) return served.inference.release();
        next.state = 'serving';
        next.served = served;
        const by = served.verifiedBy === 'chain' ? `ModelRegistry #${a.registry?.modelId} on chain ${a.registry?.chainId}` : "the orchestrator's sha256 only (an unpaid network has no ModelRegistry)";
        this.options.log(`deployment ${a.deploymentId}: serving stage ${a.stage} [${a.from}, ${a.to}), weights checked against ${by}`);
      })
      .catch((err: unknown) => {
        if (this.holding !== next) return;
        next.state = 'failed';
        next.detail = (err as Error).message.slice(0, 500);
        this.options.log(`deployment ${a.deploymentId}: refused stage ${a.stage}: ${next.detail}`);
      })
      .finally(() => (this.loading = null));
  }

  /** What the next heartbeat says of the stage (undefined: none held). */
  report(): DeploymentReport | undefined {
    const h = this.holding;
    if (!h) return undefined;
    const { deploymentId, stage } = h.assignment;
    if (h.state === 'serving' && h.served) return { deploymentId, stage, state: 'serving', sha256: h.served.sha256, verifiedBy: h.served.verifiedBy };
    if (h.state === 'failed') return { deploymentId, stage, state: 'failed', detail: h.detail ?? 'failed' };
    return { deploymentId, stage, state: 'loading' };
  }

  /** The stage served now, loaded from checked weights (null: none, or not yet). */
  served(): ServedStage | null {
    return this.holding?.state === 'serving' ? (this.holding.served ?? null) : null;
  }

  /** Lets go of the stage and waits for a load under way to end. */
  async stop(): Promise<void> {
    if (this.holding) this.release(this.holding);
    await this.loading;
  }

  private release(h: Holding): void {
    h.abort.abort();
    h.served?.inference.release();
    h.served = undefined;
    if (this.holding === h) this.holding = null;
    this.options.log(`deployment ${h.assignment.deploymentId}: let go of stage ${h.assignment.stage}`);
  }

  /** Download (or reuse), check, load. Throws what the stage is refused for. */
  private async load(h: Holding): Promise<ServedStage> {
    const a = h.assignment;
    const config = gptConfigOf(a.model); // an invalid reference is refused before anything is downloaded
    const path = await this.fetchFile(a, h.abort.signal);
    // the file loaded is the file checked: hashed as it is now, then only this stage's tensors read from it
    const sha256 = await sha256OfFile(path);
    const verifiedBy = await checkModelFile(sha256, a, this.options.lookup);
    if (h.abort.signal.aborted) throw new Error('let go while loading');
    const inference = await inferenceFromFile(this.options.engine, path, { from: a.from, to: a.to }, { maxSessions: a.maxSessions });
    const held = wholeModelRef({ kind: 'gpt', config: inference.config });
    if (held !== a.model && held !== wholeModelRef({ kind: 'gpt', config })) {
      inference.release();
      throw new NimbleError('invalid', `the file holds the model ${held}, not ${a.model}`);
    }
    return { assignment: a, inference, sha256, verifiedBy };
  }

  /** The model's file on disk with the assignment's sha256: kept from before, or downloaded (resuming a cut download). */
  private async fetchFile(a: DeploymentAssignment, signal: AbortSignal): Promise<string> {
    const out = join(this.options.dir, `${a.sha256}.safetensors`);
    if (existsSync(out)) {
      if ((await sha256OfFile(out)) === a.sha256) return out;
      rmSync(out, { force: true }); // not the file it names: downloaded again
    }
    const mine = join(this.options.dir, `${a.sha256}.${this.options.address.slice(2, 10).toLowerCase()}.safetensors`);
    const tries = this.options.downloadTries ?? 4;
    for (let attempt = 1; ; attempt++) {
      try {
        await downloadVerified(
          { sha256: a.sha256, bytes: a.bytes, what: `file of model ${a.sha256.slice(0, 12)}`, origin: 'the sha256 of the deployment', open: (offset, s) => this.options.open(a.sha256, offset, s) },
          mine,
          () => {},
          signal,
        );
        renameSync(mine, out);
        return out;
      } catch (err) {
        // a download cut short (or an orchestrator not answering) is tried again, resuming; anything else is the file's fault
        const transient = err instanceof NimbleError && err.code === 'unreachable';
        if (!transient || attempt >= tries || signal.aborted) throw err;
        await new Promise((r) => setTimeout(r, 250 * 2 ** attempt));
      }
    }
  }
}

function sameStage(a: DeploymentAssignment, b: DeploymentAssignment): boolean {
  return a.deploymentId === b.deploymentId && a.stage === b.stage && a.from === b.from && a.to === b.to && a.sha256 === b.sha256;
}
