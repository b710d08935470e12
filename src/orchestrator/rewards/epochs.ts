// Epochs: the orchestrator closes an epoch every N completed merge rounds of a
// run (and when a run ends, or every M minutes), scores the work logged in it
// (src/orchestrator/rewards/scoring.ts), and pays the split on chain with settleEpoch.
// Whatever else happens, an epoch closes once the oldest thing it owes (a
// unit of work logged, an inference charge not drawn yet) is `payWithinMs`
// old (10 minutes by default): a network that only serves inference, whose
// runs never merge, pays its miners and draws its callers' credit all the
// same, within a bounded time, restarts included (the times are the
// database's).
//
// Durable order, so a crash (kill -9) at any point never pays twice nor loses
// an epoch:
//   1. one SQLite transaction: the split is written (epoch_rewards), with
//      what jobs' escrows and wallets' inference credit owe for the epoch
//      (../jobs/job-payments.ts, ./credits.ts), and the epoch goes 'open' ->
//      'settling'; a new 'open' epoch starts;
//   2. the on-chain epoch id is chosen (the next id not used on chain) and
//      written before anything is sent;
//   3. settleEpoch sends the batches (idempotent, resumable);
//   4. the epoch is marked 'settled' with the transaction hash.
// At start (and on every step) each 'settling' epoch is finished: if the chain
// already shows it settled with the same digest it is only marked settled,
// otherwise the remaining batches are sent.
//
// Slashing: every offence (./offences.ts) gets a 'pending' slash row, sent
// once per offence id by ./slasher.ts at each step. The unstake cooldown must
// outlast an open check (raised on a local chain at start, a remote chain's
// refused if shorter). docs/security.md, "Money".
//
// A settlement or slash that fails is tried again after a growing wait (1 s
// doubling to 5 min, ./backoff.ts), its tries, next try and error on its row
// (a restart waits the same) and in GET /epochs, each failure logged.
import { FINAL_RUN_STATUSES } from '../../api/schemas.ts';
import { formatEther, type Address, type Hash } from 'viem';
import type { ChainClient, SigningClient } from '../../chain/client.ts';
import { normalizeRewards, readEpoch, rewardsDigest, settleEpoch, settlementTxOf, type Reward } from '../../chain/rewards.ts';
import { readStake, setCooldown, stakingTotals } from '../../chain/staking.ts';
import { formatDuration } from '../../jobs/duration.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { CreditService } from '../serving/credits.ts';
import { JobPayments } from '../jobs/job-payments.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { EpochRecord } from '../state/ledger.ts';
import { retryDelayMs, retryDue } from './backoff.ts';
import { Slasher } from './slasher.ts';
import { scoreEpoch, splitEmission, stageSharesOf, type StageShares } from './scoring.ts';

export const DEFAULT_EMISSION = 100n * 10n ** 18n;
export const DEFAULT_EPOCH_ROUNDS = 1;
/** An epoch closes once the oldest work or inference charge it owes is this old, whatever else closes it (10 minutes). */
export const DEFAULT_PAY_WITHIN_MS = 10 * 60_000;
export { SLASH_RECEIPT_TIMEOUT_MS } from './slasher.ts';

export interface ChainOptions {
  client: ChainClient;
  /** holds ORCHESTRATOR_ROLE on the RewardDistributor */
  signer: SigningClient;
  /** wei per epoch (default 100 NIM) */
  emission?: bigint;
  /** completed merge rounds of a run per epoch (default 1) */
  epochRounds?: number;
  /** also close an epoch this long after it opened (default: never) */
  epochMs?: number;
  /** close the epoch once the oldest work or inference charge it owes is this old (default DEFAULT_PAY_WITHIN_MS) */
  payWithinMs?: number;
  /** a join from an address with less stake is refused with 403 (default 0) */
  minStake?: bigint;
  /** credit rewards as stake (default true) */
  asStake?: boolean;
  /** how often epochs are checked and settled (default 500 ms) */
  intervalMs?: number;
  /** how often live miners' stakes are checked against minStake (default 10 s) */
  stakeCheckMs?: number;
  /** miners whose stake fell below minStake are removed through this */
  evict?: (minerId: string, reason: string) => void;
  /**
   * Fault injection for tests: after the chain accepted an epoch and before it
   * is recorded as settled, log and wait this long (a window for kill -9).
   */
  pauseAfterSettleMs?: number;
  /** how long a slash's receipt is awaited before the pass moves on (default SLASH_RECEIPT_TIMEOUT_MS; tests shorten it) */
  receiptTimeoutMs?: number;
  /** NIM per PFLOP of training that developers' jobs pay from their escrows (default 1) */
  nimPerPetaflop?: number;
  /** called when the orchestrator closes (stops the local node it opened) */
  close?: () => Promise<void>;
  /** the signer may raise the Staking cooldown (it is the local chain's admin) */
  local?: boolean;
  /** the RPC URL GET /chain publishes (default: the local node's; none for another chain, whose URL may hold a key) */
  publicRpcUrl?: string;
  log?: (line: string) => void;
}

export class Epochs {
  readonly emission: bigint;
  readonly epochRounds: number;
  readonly payWithinMs: number;
  /** developers' jobs paid from their escrows (null: the deployment has no JobEscrow) */
  readonly jobPayments: JobPayments | null;
  /** wallets' prepaid inference credit, paid from at every epoch (null: no JobEscrow) */
  readonly credits: CreditService | null;
  private readonly log: (line: string) => void;
  private timer: NodeJS.Timeout | null = null;
  private running: Promise<void> | null = null;
  private stakesCheckedAt = 0;
  private readonly slasher: Slasher;

  constructor(
    readonly state: OrchestratorState,
    readonly chain: ChainOptions,
    private readonly now: () => number = Date.now,
    /** the longest a spot check can stay open before it is decided (ms): the unstake cooldown must be longer */
    private readonly slashWindowMs: number = 0,
  ) {
    this.emission = chain.emission ?? DEFAULT_EMISSION;
    if (this.emission < 0n) throw new RangeError('emission must not be negative');
    this.epochRounds = chain.epochRounds ?? DEFAULT_EPOCH_ROUNDS;
    if (!Number.isInteger(this.epochRounds) || this.epochRounds < 1) throw new RangeError('epochRounds must be a positive integer');
    this.payWithinMs = chain.payWithinMs ?? DEFAULT_PAY_WITHIN_MS;
    if (!(this.payWithinMs > 0)) throw new RangeError('payWithinMs must be positive');
    this.log = chain.log ?? ((line) => console.error(`orchestrator: ${line}`));
    this.jobPayments = chain.client.deployment.jobEscrow
      ? new JobPayments(state, { client: chain.client, signer: chain.signer, nimPerPetaflop: chain.nimPerPetaflop, log: this.log }, now)
      : null;
    this.credits = this.jobPayments ? new CreditService(state, this.jobPayments, { client: chain.client, signer: chain.signer }, this.log, now) : null;
    this.slasher = new Slasher(state, chain, this.log, (minerId) => this.evictIfBelowMinimum(minerId), now);
  }

  /** Checks the unstake cooldown, finishes every epoch left in 'settling' (crash recovery), then runs a step every intervalMs. */
  async start(): Promise<void> {
    await this.checkCooldown();
    await this.reconcile();
    this.timer = setInterval(() => void this.step(), this.chain.intervalMs ?? 500);
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.running;
  }

  /** One pass: close the open epoch if it is due, settle what is settling. Never runs twice at once. */
  step(): Promise<void> {
    if (this.running) return this.running;
    this.running = (async () => {
      try {
        this.closeIfDue();
        await this.reconcile();
        await this.checkStakes();
      } catch (err) {
        this.log(`epochs: ${(err as Error).message}`);
      } finally {
        this.running = null;
      }
    })();
    return this.running;
  }

  /**
   * Settles every 'settling' epoch, oldest first, then sends pending slashes.
   * A failure is recorded on its row with its tries and next try, logged,
   * and tried again only after its backoff (./backoff.ts), never at every pass.
   */
  async reconcile(): Promise<void> {
    for (const e of this.state.ledger.epochs('settling')) {
      if (!retryDue(e.retryAt, this.now())) continue;
      try {
        await this.settle(e);
      } catch (err) {
        const message = (err as Error).message.split('\n')[0];
        const attempts = e.attempts + 1;
        const wait = retryDelayMs(attempts);
        this.state.ledger.setEpochError(e.id, message, attempts, this.now() + wait);
        this.log(`epoch ${e.id}: settlement failed (attempt ${attempts}), retrying in ${formatDuration(wait)}: ${message}`);
      }
    }
    await this.slasher.reconcile();
    await this.jobPayments?.reconcile();
    await this.credits?.reconcile();
  }

  /**
   * Closes the open epoch when a run completed `epochRounds` more merge
   * rounds, ended, time is up, or the oldest work or inference charge it owes
   * is `payWithinMs` old.
   */
  closeIfDue(): EpochRecord | null {
    return this.state.tx(() => {
      const now = this.now();
      const open = this.state.ledger.openEpoch(now);
      const firstWork = this.state.ledger.firstWorkAtAfter(open.fromLog);
      const firstCharge = this.credits ? this.state.inferenceRequests.oldestUnallocatedAt() : null;
      if (firstWork === null && firstCharge === null) return null;
      if (firstWork !== null) {
        for (const run of this.state.runs.list()) {
          const mark = this.state.ledger.runMergesMark(run.id);
          if (run.mergesDone - mark >= this.epochRounds) return this.close(run.id, run.mergesDone);
          if (FINAL_RUN_STATUSES.includes(run.status) && this.state.ledger.countWorkAfter(open.fromLog, run.id) > 0) return this.close(run.id, run.mergesDone);
        }
        if (this.chain.epochMs !== undefined && now - open.openedAt >= this.chain.epochMs) return this.close(null, 0);
      }
      const owedSince = Math.min(firstWork ?? Infinity, firstCharge ?? Infinity);
      if (now - owedSince >= this.payWithinMs) return this.close(null, 0);
      return null;
    });
  }

  /** Closes the open epoch now: scores its work and writes the split ('settling'). Null when it holds no work and no inference charge. */
  close(runId: string | null, mergesMark: number): EpochRecord | null {
    return this.state.tx(() => {
      const now = this.now();
      const open = this.state.ledger.openEpoch(now);
      const to = this.state.ledger.lastWorkId();
      if (to <= open.fromLog && (!this.credits || this.state.inferenceRequests.oldestUnallocatedAt() === null)) return null;
      const rows = this.state.ledger.workBetween(open.fromLog, to);
      const shares = this.sharesOf(rows.map((r) => r.runId), rows.map((r) => r.deploymentId));
      const scores = scoreEpoch(rows, shares);
      const split = splitEmission(scores, this.emission);
      split.rewards.forEach((r, i) => {
        this.state.ledger.putReward({ epoch: open.id, miner: r.miner, score: r.score, amount: r.amount, units: scores[i].units });
      });
      // what developers' escrows owe their jobs' miners for this epoch, in the same transaction
      this.jobPayments?.allocate(open.id, rows, shares);
      // what callers' credit owes for the inference charged since the last epoch: miners and model owners
      this.credits?.allocate(open.id, shares);
      const paid = split.rewards.some((r) => r.amount > 0n);
      this.state.ledger.closeEpoch(open.id, { runId, mergesMark, toLog: to, closedAt: now, emission: this.emission, remainder: split.remainder, settled: !paid });
      this.state.ledger.openEpoch(now);
      return this.state.ledger.epoch(open.id)!;
    });
  }

  /**
   * The unstake cooldown must outlast the slash window (a check open, then
   * decided and slashed); a local chain's is raised to it, a remote chain
   * that is shorter is refused.
   */
  private async checkCooldown(): Promise<void> {
    const needed = Math.ceil(this.slashWindowMs / 1000);
    if (needed <= 0) return;
    const { cooldown } = await stakingTotals(this.chain.client);
    if (cooldown >= needed) return;
    if (!this.chain.local) {
      throw new NimbleError('conflict', `the chain's unstake cooldown is ${cooldown} s; spot checks need at least ${needed} s so that a miner cannot withdraw between a check and its slash (raise it with Staking.setCooldown)`);
    }
    await setCooldown(this.chain.client, this.chain.signer, BigInt(needed));
    this.log(`raised the local chain's unstake cooldown from ${cooldown} s to ${needed} s (the slash window)`);
  }

  /** The reward list of an epoch, as posted (normalized: zero amounts dropped). */
  rewardList(epochId: number): Reward[] {
    return normalizeRewards(this.state.ledger.rewards(epochId).map((r) => ({ address: r.miner as Address, amount: BigInt(r.amount) })));
  }

  private async settle(e: EpochRecord): Promise<void> {
    const { client, signer } = this.chain;
    const list = this.rewardList(e.id);
    if (list.length === 0) {
      this.state.ledger.markSettled(e.id, null, this.now());
      return;
    }
    const digest = rewardsDigest(list);
    let chainEpoch = e.chainEpoch === null || e.chainId !== client.chainId ? null : BigInt(e.chainEpoch);
    if (chainEpoch !== null) {
      // an id someone else used (another orchestrator on the same chain) is given up for a fresh one
      const status = await readEpoch(client, chainEpoch);
      if (status.batchesPosted > 0 && status.digest !== digest) {
        this.log(`epoch ${e.id}: on-chain epoch ${chainEpoch} holds another list; choosing a new id`);
        chainEpoch = null;
      }
    }
    if (chainEpoch === null) {
      chainEpoch = await this.freeChainEpoch();
      this.state.ledger.setChainEpoch(e.id, chainEpoch, client.chainId); // durable before sending
    }
    const result = await settleEpoch(client, signer, chainEpoch, list, { asStake: this.chain.asStake ?? true });
    if (this.chain.pauseAfterSettleMs) {
      this.log(`epoch ${e.id}: on chain as epoch ${chainEpoch}, pausing ${this.chain.pauseAfterSettleMs} ms before recording it (test hook)`);
      await new Promise((r) => setTimeout(r, this.chain.pauseAfterSettleMs));
    }
    let txHash: Hash | null = result.txHashes.at(-1) ?? null;
    if (result.alreadySettled) {
      if (result.digest !== digest) throw new Error(`on-chain epoch ${chainEpoch} was settled with another list`);
      txHash = await settlementTxOf(client, chainEpoch);
    }
    this.state.ledger.markSettled(e.id, txHash, this.now());
    const total = list.reduce((a, r) => a + r.amount, 0n);
    this.log(`epoch ${e.id}: ${result.alreadySettled ? 'found settled' : 'settled'} on chain as epoch ${chainEpoch}: ${formatEther(total)} NIM to ${list.length} miner(s)${txHash ? ` (tx ${txHash})` : ''}`);
  }

  /** The next on-chain epoch id after those this database used that nothing was posted to. */
  private async freeChainEpoch(): Promise<bigint> {
    let id = this.state.ledger.maxChainEpoch() + 1n;
    for (;;) {
      const s = await readEpoch(this.chain.client, id);
      if (s.batchesPosted === 0 && !s.settled) return id;
      id++;
    }
  }

  /** Each run's and each deployment's stage shares of the model's parameters. */
  private sharesOf(runIds: (string | null)[], deploymentIds: (string | null)[] = []): StageShares {
    const shares: StageShares = {};
    for (const id of new Set(deploymentIds)) {
      const d = id === null ? undefined : this.state.deployments.get(id);
      if (!d) continue;
      const stages = this.state.deployments.stages(d.id);
      try {
        shares[d.id] = stageSharesOf(d.model, stages.map((s) => ({ from: s.fromPart, to: s.toPart })));
      } catch {
        shares[d.id] = stages.map(() => 1 / Math.max(1, stages.length));
      }
    }
    for (const id of new Set(runIds)) {
      if (id === null) continue;
      const run = this.state.runs.get(id);
      if (!run) continue;
      const stages = this.state.runs.stages(id);
      try {
        shares[id] = stageSharesOf(run.model, stages.map((s) => ({ from: s.fromPart, to: s.toPart })));
      } catch {
        shares[id] = stages.map(() => 1 / Math.max(1, stages.length));
      }
    }
    return shares;
  }

  /** Every stakeCheckMs: a live miner whose stake fell below the minimum (it unstaked, or was slashed) is evicted. */
  private async checkStakes(): Promise<void> {
    const min = this.chain.minStake ?? 0n;
    if (min <= 0n || !this.chain.evict) return;
    const now = this.now();
    if (now - this.stakesCheckedAt < (this.chain.stakeCheckMs ?? 10_000)) return;
    this.stakesCheckedAt = now;
    for (const m of this.state.miners.list(true)) await this.evictIfBelowMinimum(m.id);
  }

  /** Evicts a live miner whose stake is below the minimum (checked again right after a slash). */
  private async evictIfBelowMinimum(minerId: string): Promise<void> {
    const min = this.chain.minStake ?? 0n;
    const m = this.state.miners.get(minerId);
    if (min <= 0n || !this.chain.evict || !m?.alive) return;
    const { staked } = await readStake(this.chain.client, minerId as Address);
    if (staked >= min) return;
    const reason = `stake too low: ${m.id} has ${formatEther(staked)} NIM staked, this orchestrator requires ${formatEther(min)} NIM (nbcli stake add, then restart the miner)`;
    this.log(`evicting ${m.name} (${m.id}): ${reason}`);
    this.chain.evict(m.id, reason);
  }

  /** Refuses a join from an address whose stake is below the minimum. */
  async checkStake(minerId: string): Promise<void> {
    const min = this.chain.minStake ?? 0n;
    if (min <= 0n) return;
    const { staked } = await readStake(this.chain.client, minerId as Address);
    if (staked < min) {
      throw new NimbleError('stake_too_low', `stake too low: ${minerId} has ${formatEther(staked)} NIM staked, this orchestrator requires ${formatEther(min)} NIM (nbcli stake add)`, 403);
    }
  }
}
