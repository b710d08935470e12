// What a miner checks before it serves a deployed model's weights
// (docs/inference.md, "Deploy"): the file it downloaded has the sha256 the
// deployment names, and, on a paid network, that sha256 is a model published
// on the ModelRegistry, read on the chain the orchestrator names, which the
// miner checks is that chain (src/miner/chain.ts; its --chain-rpc must be the
// same chain): the orchestrator's word alone cannot make a miner serve
// weights nobody published on it. On an unpaid network (no chain) the
// only check is the orchestrator's sha256, and the miner says so.
import type { Hex } from 'viem';
import { LOCAL_DEPLOYMENT_KEY, readDeployments } from '../chain/deploy.ts';
import { modelOfSha256 } from '../chain/registry.ts';
import { withChain } from '../chain/session.ts';
import type { DeploymentAssignment } from '../protocol/messages.ts';
import { NimbleError } from '../protocol/errors.ts';

/** What the miner's chain says of a sha256: where it looked, and the model published with it (null: none). */
export interface RegistryReading {
  chainId: number;
  /** the ModelRegistry's address */
  registry: string;
  model: { id: bigint; name: string; owner: string } | null;
}

/** Reads the ModelRegistry entry of a sha256 (hex, no 0x) on the miner's chain. */
export type RegistryLookup = (sha256: string) => Promise<RegistryReading>;

/** How the weights were checked: against the registry on chain, or (unpaid network) against the orchestrator's sha256 only. */
export type VerifiedBy = 'chain' | 'sha256';

/**
 * Checks a downloaded model file, whose sha256 is `fileSha256`, for
 * `assignment`. Throws a NimbleError saying what does not match; returns
 * what the weights were checked against.
 */
export async function checkModelFile(fileSha256: string, assignment: Pick<DeploymentAssignment, 'sha256' | 'registry'>, lookup: RegistryLookup | null): Promise<VerifiedBy> {
  if (fileSha256 !== assignment.sha256) throw new NimbleError('corrupt', `the model file has sha256 ${fileSha256}, not ${assignment.sha256}`);
  const want = assignment.registry;
  if (!want) return 'sha256';
  if (!lookup) {
    throw new NimbleError(
      'forbidden',
      `this network's models are registered on chain ${want.chainId} (ModelRegistry ${want.address}) and this miner has no chain to check them on: start it with --chain-rpc URL, or in the data dir of that chain`,
    );
  }
  const seen = await lookup(assignment.sha256);
  if (seen.chainId !== want.chainId || seen.registry.toLowerCase() !== want.address.toLowerCase()) {
    throw new NimbleError('forbidden', `the orchestrator names ModelRegistry ${want.address} on chain ${want.chainId}; this miner's chain is ${seen.chainId} with ModelRegistry ${seen.registry}`);
  }
  if (!seen.model) throw new NimbleError('forbidden', `no model with sha256 ${assignment.sha256} is published on chain ${seen.chainId}: its weights are not served`);
  if (seen.model.id !== BigInt(want.modelId)) {
    throw new NimbleError('forbidden', `sha256 ${assignment.sha256} is model #${seen.model.id} on chain ${seen.chainId}, not #${want.modelId} as the orchestrator says`);
  }
  return 'chain';
}

/**
 * A registry lookup on a chain of the miner's own (for an orchestrator that
 * does not name its chain, and for tests): on the chain at `rpcUrl` (addresses from
 * <dataDir>/chain/deployment.json), else on the local node of `dataDir` when
 * a local chain was deployed there (the miner shares its data dir with the
 * orchestrator, as `nbcli up`'s miners do); null when the miner has no chain.
 * Each lookup opens the chain for that one read (the local node is reused
 * while the orchestrator runs it).
 */
export function chainRegistryLookup(dataDir: string, rpcUrl?: string): RegistryLookup | null {
  if (!rpcUrl && !readDeployments(dataDir)[LOCAL_DEPLOYMENT_KEY]) return null;
  return (sha256) =>
    withChain({ dataDir, rpcUrl }, async (client) => {
      const m = await modelOfSha256(client, `0x${sha256}` as Hex);
      return { chainId: client.chainId, registry: client.deployment.modelRegistry, model: m ? { id: m.id, name: m.name, owner: m.owner } : null };
    });
}
