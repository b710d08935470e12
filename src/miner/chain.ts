// The chain a miner checks deployed models' weights on (docs/inference.md,
// "Deploy"): the one its orchestrator pays on, as GET /chain names it, signed
// with the network's key the miner verified at start (src/api/network.ts).
// The miner checks that chain on the RPC it uses, the orchestrator's or its
// own --chain-rpc: the chain id, the genesis hash, the block the contracts
// were deployed in, and their code (src/chain/identity.ts). A chain that is
// not what the orchestrator says is refused, and every deployment stage with
// it, with that line. An orchestrator from before GET /chain says nothing:
// the miner's own chain then (--chain-rpc, or its data dir's local node).
import type { Hex } from 'viem';
import type { OrchestratorClient } from '../api/client.ts';
import type { ChainClient } from '../chain/client.ts';
import { deploymentFile, readDeployments } from '../chain/deploy.ts';
import { describeChain, openClaimedChain } from '../chain/identity.ts';
import { modelOfSha256 } from '../chain/registry.ts';
import { chainRegistryLookup, type RegistryLookup } from '../inference/verify.ts';
import { NimbleError } from '../protocol/errors.ts';

export interface MinerChainOptions {
  /** the orchestrator's public API, for the network the miner joined */
  api: OrchestratorClient;
  /** --chain-rpc: check on this node, which must be the orchestrator's chain */
  rpcUrl?: string;
  /** the data dir with chain/deployment.json (contracts it records must be the orchestrator's) */
  dataDir: string;
  log: (line: string) => void;
}

/**
 * The registry lookup of a miner that learns its chain from its orchestrator.
 * The chain is asked for and checked again on each lookup (once per stage a
 * deployment gives it), so an orchestrator restarted on a node at another
 * port is followed; each new outcome is logged once.
 */
export function learnedRegistryLookup(opts: MinerChainOptions): { lookup: RegistryLookup; check: () => Promise<void> } {
  let said = '';
  const say = (line: string): void => {
    if (line !== said) opts.log(line);
    said = line;
  };
  const open = async (): Promise<ChainClient | RegistryLookup | null> => {
    const claim = await opts.api.chain();
    if (claim === undefined) {
      const own = chainRegistryLookup(opts.dataDir, opts.rpcUrl);
      if (own) return own;
      throw new NimbleError('forbidden', 'the orchestrator does not say which chain it pays on (it is from before GET /chain) and this miner has no chain of its own to check the weights on: start it with --chain-rpc URL');
    }
    if (claim === null) return null;
    try {
      const client = await openClaimedChain(claim, { rpcUrl: opts.rpcUrl, who: 'this miner', known: readDeployments(opts.dataDir), knownFile: deploymentFile(opts.dataDir) });
      say(`chain: deployed models are checked on the orchestrator's chain (${describeChain(client.rpcUrl, claim)}, ModelRegistry ${client.deployment.modelRegistry})`);
      return client;
    } catch (err) {
      const line = `chain: refused the orchestrator's chain: ${(err as Error).message}`;
      say(line);
      throw new NimbleError(err instanceof NimbleError ? err.code : 'conflict', line.replace(/^chain: /, ''), undefined, { cause: err });
    }
  };
  const lookup: RegistryLookup = async (sha256) => {
    const chain = await open();
    if (chain === null) throw new NimbleError('forbidden', 'the orchestrator names no chain (an unpaid network), so no ModelRegistry to check the weights on');
    if (typeof chain === 'function') return chain(sha256);
    const m = await modelOfSha256(chain, `0x${sha256}` as Hex);
    return { chainId: chain.chainId, registry: chain.deployment.modelRegistry, model: m ? { id: m.id, name: m.name, owner: m.owner } : null };
  };
  // at start: say which chain it is (or why it is refused) before any deployment asks
  const check = async (): Promise<void> => {
    // a stage asked of it is refused with the same line
    await open().catch((err: Error) => say(`chain: ${err.message}`));
  };
  return { lookup, check };
}
