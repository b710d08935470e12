// Keeping a job's checkpoints (docs/jobs.md "Checkpoints and retention"): the
// stages' latest merged states assembled into one whole-model file every
// `checkpointEvery` steps and at the end, measured on held-out data
// (./checkpoint-eval.ts), stored as a blob and recorded as the job's
// checkpoint, in the background, once per merge round.
import { assembleWholeModel } from '../training/checkpoint.ts';
import { heldoutWords } from './checkpoint-eval.ts';
import type { Coordinator } from '../training/coordinator.ts';
import type { JobRecord } from '../state/jobs.ts';
import type { RunRecord } from '../state/runs.ts';

/** Whether the latest merged state is kept ('kept': already, or there is none), being kept, or not due. */
export type KeepOutcome = 'kept' | 'saving' | 'not due';

export class JobCheckpoints {
  /** per run of a job: the merge round of the stages' states last kept as a checkpoint */
  private readonly keptRound = new Map<string, number>();
  /** jobs whose checkpoint is being written */
  private readonly saving = new Set<string>();
  private readonly pending = new Set<Promise<void>>();

  constructor(
    private readonly c: Coordinator,
    /** called when a job's checkpoints changed */
    private readonly changed: (jobId: string) => void,
    private readonly now: () => number = Date.now,
  ) {}

  /**
   * Keeps the stages' latest merged states as a whole-model checkpoint when
   * `checkpointEvery` steps passed since the last one (or now, when `final`),
   * once per merge round, in the background.
   */
  keep(job: JobRecord, run: RunRecord, final: boolean): KeepOutcome {
    const state = this.c.state;
    if (this.saving.has(job.id)) return 'saving';
    const stages = state.runs.stages(run.id);
    if (stages.length === 0 || stages.some((s) => !s.stateBlob)) return 'kept';
    const round = Math.min(...stages.map((s) => s.round));
    if (round === 0 || this.keptRound.get(run.id) === round) return 'kept';
    const last = state.jobs.checkpoints(job.id).at(-1);
    const step = job.stepBase + run.microbatchesDone;
    const tokens = job.tokenBase + run.tokensDone;
    if (!final && step - (last?.step ?? 0) < job.checkpointEvery) return 'not due';
    this.saving.add(job.id);
    const task = (async () => {
      try {
        const whole = await assembleWholeModel(state, this.c.blobs, run.id, { job: job.id }, { step, tokens });
        // measured on held-out data (the figures in its metadata and row); kept without them when that fails
        const { bytes, heldout } = await this.c.evaluator.encodeMeasured(whole, run, (err) => console.error(`job ${job.id}: the checkpoint at step ${step} is kept without held-out figures: ${err.message}`));
        const blob = await this.c.blobs.put(bytes);
        const kept = state.jobs.addCheckpoint({ jobId: job.id, step, tokens, loss: run.lastLoss, heldoutLoss: heldout?.loss ?? null, heldoutAccuracy: heldout?.accuracy ?? null, blob, bytes: bytes.length }, this.now());
        state.garbage.release(blob);
        if (kept) {
          state.jobs.note(job.id, `checkpoint at step ${step} kept (${(bytes.length / 1e6).toFixed(1)} MB, merge round ${round}${heldoutWords(heldout)})`, this.now(), 'checkpoint');
        }
        this.keptRound.set(run.id, round);
        this.changed(job.id);
      } catch (err) {
        console.error(`job ${job.id}: checkpoint at step ${step} failed: ${(err as Error).message}`);
      } finally {
        this.saving.delete(job.id);
      }
    })();
    this.pending.add(task);
    void task.finally(() => this.pending.delete(task));
    return 'saving';
  }

  /** The run has ended: its round is no longer followed. */
  forget(runId: string): void {
    this.keptRound.delete(runId);
  }

  /** Resolves once the checkpoints being written are stored. */
  async settled(): Promise<void> {
    while (this.pending.size) await Promise.allSettled([...this.pending]);
  }
}
