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
import type { Hex } from 'viem';
import { modelOfSha256, setModelDeployed } from '../../chain/registry.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { ChainOptions } from '../rewards/epochs.ts';
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

/** Keeps the registry's deployed flag of every deployed model in step with its deployments. */
export class RegistrySync {
  private running: Promise<void> | null = null;
  private failedAt = -Infinity;

  constructor(
    private readonly state: OrchestratorState,
    private readonly registry: ModelRegistryAccess,
    private readonly log: (line: string) => void = () => {},
    private readonly now: () => number = Date.now,
  ) {}

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
    for (const [sha256, rows] of bySha) {
      const live = rows.filter((d) => d.status !== 'undeployed');
      // serving: set; nothing live: cleared; only deploying: left as it is (a replica being replaced does not flap the flag)
      const want = live.some((d) => d.status === 'serving') ? true : live.length === 0 ? false : null;
      if (want === null) continue;
      if (rows.every((d) => d.registryDeployed === (d.status === 'undeployed' ? false : want))) continue;
      const entry = await this.registry.lookup(sha256);
      if (!entry) {
        this.log(`registry: model ${sha256} of deployment ${rows[0].id} is not on the ModelRegistry`);
        continue;
      }
      if (entry.deployed !== want) {
        const tx = await this.registry.setDeployed(entry.id, want);
        this.log(`registry: model #${entry.id} '${entry.name}' ${want ? 'deployed' : 'undeployed'} (tx ${tx})`);
      }
      this.state.tx(() => {
        for (const d of rows) this.state.deployments.setRegistryDeployed(d.id, d.status === 'undeployed' ? false : want);
      });
    }
  }
}
