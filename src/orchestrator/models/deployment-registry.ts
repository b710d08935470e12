// The ModelRegistry side of deployments: who owns a published model (only its
// owner deploys it), and the registry's `deployed` flag kept in step with the
// deployments (docs/inference.md, "Deploy"). ModelRegistry.deploy/undeploy
// accept the model's owner or an ORCHESTRATOR_ROLE account; the orchestrator
// sends them itself, so the flag follows what miners actually do: set once a
// deployment is serving, cleared once none of the model's deployments is live
// (its owner undeployed it, or it went idle: the owner is not there then).
//
// The flag is reconciled, not sent once: each pass reads the chain and sends
// only what differs, so a restart, a failed transaction or the owner setting
// it by hand are set right on a later pass.
//
// The orchestrator pays for these transactions, its owner only signs a
// request, so they are bounded (../rewards/gas.ts): an owner deploys at most
// GAS_LIMITS.deploysPerOwner models an hour (counted from the deployments
// table, a 429 past it), the flags of one owner's models change at most
// GAS_LIMITS.registryTxsPerOwner times an hour and everyone's
// GAS_LIMITS.registryTxs; a change past its budget waits for a later pass,
// and one undone meanwhile (deployed, then undeployed) costs nothing.
import type { Hex } from 'viem';
import { modelOfSha256, setModelDeployed } from '../../chain/registry.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { ChainOptions } from '../rewards/epochs.ts';
import { GAS_LIMITS, HOUR_MS, minutesOf, SlidingWindow } from '../rewards/gas.ts';
import type { DeploymentRecord } from '../state/deployments.ts';
import type { OrchestratorState } from '../state/index.ts';

/** The ModelRegistry as deployments use it. */
export interface ModelRegistryAccess {
  chainId: number;
  /** the registry's address */
  address: string;
  /** The model published with this sha256 (hex, no 0x), or null. */
  lookup(sha256: string): Promise<{ id: bigint; name: string; owner: string; deployed: boolean } | null>;
  /** Sets the model's deployed flag (as ORCHESTRATOR_ROLE); the transaction's hash. */
  setDeployed(modelId: bigint, deployed: boolean): Promise<string>;
}

export function chainModelRegistry(chain: Pick<ChainOptions, 'client' | 'signer'>): ModelRegistryAccess {
  const { client, signer } = chain;
  return {
    chainId: client.chainId,
    address: client.deployment.modelRegistry,
    async lookup(sha256) {
      try {
        const m = await modelOfSha256(client, `0x${sha256}` as Hex);
        return m ? { id: m.id, name: m.name, owner: m.owner, deployed: m.deployed } : null;
      } catch (err) {
        throw new NimbleError('unreachable', `cannot read the ModelRegistry at ${client.rpcUrl}: ${(err as Error).message.split('\n')[0]}`, 502, { cause: err });
      }
    },
    async setDeployed(modelId, deployed) {
      return (await setModelDeployed(client, signer, modelId, deployed)).hash;
    },
  };
}

/** After a failed pass, the next waits this long. */
const RETRY_MS = 10_000;

/**
 * Refuses (429) a deploy by `owner` when it made GAS_LIMITS.deploysPerOwner
 * deployments in the hour before `now`: each deploy and undeploy costs the
 * orchestrator a ModelRegistry transaction. Counted from the deployments
 * table, so a restart forgets nothing.
 */
export function checkDeployRate(state: OrchestratorState, owner: string, now: number): void {
  const limit = GAS_LIMITS.deploysPerOwner;
  const recent = state.deployments.createdSince(owner, now - HOUR_MS);
  if (recent.length < limit) return;
  const wait = recent[recent.length - limit] + HOUR_MS - now;
  throw new NimbleError(
    'rate_limited',
    `${owner} deployed ${recent.length} times in the last hour; each deploy and undeploy costs the orchestrator a ModelRegistry transaction, so an owner deploys at most ${limit} times an hour: the next in ${minutesOf(wait)}`,
    429,
  );
}

/** Keeps the registry's deployed flag of every deployed model in step with its deployments. */
export class RegistrySync {
  private running: Promise<void> | null = null;
  private failedAt = -Infinity;
  /** flag transactions sent, per owner and for everyone ('') */
  private readonly perOwner: SlidingWindow;
  private readonly all: SlidingWindow;
  /** models whose flag change waits for a budget, until when (logged once each; not read again before) */
  private readonly waiting = new Map<string, number>();

  constructor(
    private readonly state: OrchestratorState,
    private readonly registry: ModelRegistryAccess,
    private readonly log: (line: string) => void = () => {},
    private readonly now: () => number = Date.now,
  ) {
    this.perOwner = new SlidingWindow(GAS_LIMITS.registryTxsPerOwner, HOUR_MS, now);
    this.all = new SlidingWindow(GAS_LIMITS.registryTxs, HOUR_MS, now);
  }

  /** Starts a pass unless one is under way (or one failed less than RETRY_MS ago); resolves when it ends. */
  step(): Promise<void> {
    if (this.running) return this.running;
    if (this.now() - this.failedAt < RETRY_MS) return Promise.resolve();
    this.running = this.pass()
      .catch((err: unknown) => {
        this.failedAt = this.now();
        this.log(`registry: ${(err as Error).message}`);
      })
      .finally(() => (this.running = null));
    return this.running;
  }

  /** Resolves once no pass is under way. */
  async settled(): Promise<void> {
    await this.running;
  }

  private async pass(): Promise<void> {
    const bySha = new Map<string, DeploymentRecord[]>();
    for (const d of this.state.deployments.registryPending()) bySha.set(d.sha256, [...(bySha.get(d.sha256) ?? []), d]);
    // owners who spent the least of their budget first: one owner's churn does not hold everyone's flags back
    const order = [...bySha].sort((a, b) => this.perOwner.count(ownerKey(a[1][0].owner)) - this.perOwner.count(ownerKey(b[1][0].owner)));
    for (const [sha256, rows] of order) {
      const live = rows.filter((d) => d.status !== 'undeployed');
      // serving: set; nothing live: cleared; only deploying: left as it is (a replica being replaced does not flap the flag)
      const want = live.some((d) => d.status === 'serving') ? true : live.length === 0 ? false : null;
      if (want === null) continue;
      if (rows.every((d) => d.registryDeployed === (d.status === 'undeployed' ? false : want))) {
        this.waiting.delete(sha256);
        continue;
      }
      if ((this.waiting.get(sha256) ?? 0) > this.now()) continue;
      const entry = await this.registry.lookup(sha256);
      if (!entry) {
        this.log(`registry: model ${sha256} of deployment ${rows[0].id} is not on the ModelRegistry`);
        continue;
      }
      if (entry.deployed !== want) {
        const owner = ownerKey(rows[0].owner);
        const wait = Math.max(this.perOwner.waitMs(owner), this.all.waitMs(''));
        if (wait > 0) {
          if (!this.waiting.has(sha256)) this.log(`registry: model #${entry.id} '${entry.name}' stays ${entry.deployed ? 'deployed' : 'undeployed'} on the registry for now: the hour's budget of flag transactions (${GAS_LIMITS.registryTxsPerOwner} per owner, ${GAS_LIMITS.registryTxs} in all) is spent, next in ${minutesOf(wait)}`);
          this.waiting.set(sha256, this.now() + wait);
          continue;
        }
        this.perOwner.take(owner);
        this.all.take('');
        this.waiting.delete(sha256);
        const tx = await this.registry.setDeployed(entry.id, want);
        this.log(`registry: model #${entry.id} '${entry.name}' ${want ? 'deployed' : 'undeployed'} (tx ${tx})`);
      }
      this.waiting.delete(sha256);
      this.state.tx(() => {
        for (const d of rows) this.state.deployments.setRegistryDeployed(d.id, d.status === 'undeployed' ? false : want);
      });
    }
  }
}

const ownerKey = (owner: string): string => owner.toLowerCase();
