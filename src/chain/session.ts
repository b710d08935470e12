// Opening the chain for one command: the local anvil node of the data dir
// (started, deployed to once, stopped after) or any RPC endpoint given with
// --chain-rpc, whose contract addresses must be in deployment.json.
import { randomBytes } from 'node:crypto';
import type { Account, Address } from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import { NimbleError } from '../protocol/errors.ts';
import { LOCAL_CHAIN_ID, rpc, RPC_ANY } from './anvil.ts';
import { createChainPublicClient, chainDefinition, makeChainClient, signerFor, type ChainClient } from './client.ts';
import { deployContracts, deploymentFile, deploymentIsCurrent, LOCAL_DEPLOYMENT_KEY, readDeployments, saveDeployment, upgradeDeployment, type DeployOptions } from './deploy.ts';
import { openLocalNode, type LocalNode } from './node.ts';

/**
 * The operator key of a LOCAL chain: anvil's first well-known development
 * account (mnemonic "test test ... junk", index 0). It deploys the contracts,
 * is their admin, holds the orchestrator role and runs the faucet. Everyone
 * knows this key: it is only ever used on the loopback-only local node.
 */
export const LOCAL_OPERATOR_KEY = '0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80' as const;

export function localOperatorAccount(): Account {
  return privateKeyToAccount(LOCAL_OPERATOR_KEY);
}

export interface OpenChainOptions {
  dataDir: string;
  /** --chain-rpc: use this node instead of the local one */
  rpcUrl?: string;
  /** keep the local node running for other commands until close() (orchestrator) */
  persistent?: boolean;
  /** cooldown of the Staking contract when the local chain is first deployed (default 0, or $NIMBLE_UNSTAKE_COOLDOWN) */
  unstakeCooldownSeconds?: number;
}

export interface ChainSession {
  client: ChainClient;
  /** the local node, when no RPC URL was given */
  node?: LocalNode;
  /** Dumps and stops the local node if this session started it. */
  close(): Promise<void>;
}

export async function openChain(opts: OpenChainOptions): Promise<ChainSession> {
  if (opts.rpcUrl) return { client: await connectRemote(opts.dataDir, opts.rpcUrl), close: async () => {} };
  const node = await openLocalNode(opts.dataDir, { persistent: opts.persistent });
  try {
    const client = await ensureLocalDeployment(opts, node);
    return { client, node, close: () => node.release() };
  } catch (err) {
    await node.release();
    throw err;
  }
}

async function ensureLocalDeployment(opts: OpenChainOptions, node: LocalNode): Promise<ChainClient> {
  const known = readDeployments(opts.dataDir)[LOCAL_DEPLOYMENT_KEY];
  const chain = chainDefinition(LOCAL_CHAIN_ID, node.rpcUrl, true);
  const pub = createChainPublicClient(chain, true);
  const operator = localOperatorAccount();
  const target = { chainId: LOCAL_CHAIN_ID, chain, local: true, public: pub };
  if (known && (await hasCode(pub, known.nim))) {
    if (await deploymentIsCurrent(target, known)) return makeChainClient(node.rpcUrl, LOCAL_CHAIN_ID, true, known);
    // deployed before JobEscrow (or its lock) existed: add it (and the attested ModelRegistry), keep every balance
    const upgraded = await upgradeDeployment(target, signerFor({ chain, local: true }, operator), known, escrowTimesFromEnv());
    saveDeployment(opts.dataDir, upgraded, LOCAL_DEPLOYMENT_KEY);
    await node.dump();
    return makeChainClient(node.rpcUrl, LOCAL_CHAIN_ID, true, upgraded);
  }
  const cooldown = opts.unstakeCooldownSeconds ?? Number(process.env.NIMBLE_UNSTAKE_COOLDOWN ?? 0);
  if (!Number.isInteger(cooldown) || cooldown < 0) throw new NimbleError('invalid', `unstake cooldown must be a whole number of seconds, got ${cooldown}`);
  // Two nodes started in the same second have the same genesis, and the same deployment makes the same blocks:
  // 1 wei to a random address makes the contracts' block, and so this chain's identity, this data dir's own (./identity.ts)
  await rpc(node.rpcUrl, 'anvil_setBalance', [`0x${randomBytes(20).toString('hex')}`, '0x1'], RPC_ANY);
  const deployment = await deployContracts(target, signerFor({ chain, local: true }, operator), {
    orchestrator: operator.address,
    faucet: operator.address,
    unstakeCooldownSeconds: cooldown,
    ...escrowTimesFromEnv(),
  });
  saveDeployment(opts.dataDir, deployment, LOCAL_DEPLOYMENT_KEY);
  await node.dump();
  return makeChainClient(node.rpcUrl, LOCAL_CHAIN_ID, true, deployment);
}

/**
 * JobEscrow's refund delay and lock timeout for a local chain deployed now:
 * the defaults, or $NIMBLE_ESCROW_REFUND_DELAY / $NIMBLE_ESCROW_LOCK_SECONDS
 * (whole seconds; tests shorten them to see a refund time or a lapsed lock).
 */
function escrowTimesFromEnv(): Pick<DeployOptions, 'escrowRefundDelaySeconds' | 'escrowLockSeconds'> {
  const read = (name: string): number | undefined => {
    const raw = process.env[name];
    if (raw === undefined || raw === '') return undefined;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 1) throw new NimbleError('invalid', `$${name} must be a whole number of seconds (at least 1), got '${raw}'`);
    return n;
  };
  return { escrowRefundDelaySeconds: read('NIMBLE_ESCROW_REFUND_DELAY'), escrowLockSeconds: read('NIMBLE_ESCROW_LOCK_SECONDS') };
}

async function connectRemote(dataDir: string, rpcUrl: string): Promise<ChainClient> {
  let url: URL;
  try {
    url = new URL(rpcUrl);
  } catch {
    throw new NimbleError('invalid', `--chain-rpc must be an http(s) URL, got '${rpcUrl}'`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new NimbleError('invalid', `--chain-rpc must be an http(s) URL, got '${rpcUrl}'`);
  const probe = createChainPublicClient(chainDefinition(1, rpcUrl, false), false);
  let chainId: number;
  try {
    chainId = await probe.getChainId();
  } catch (err) {
    throw new NimbleError('unreachable', `cannot reach the chain at ${rpcUrl}: ${(err as Error).message.split('\n')[0]}`);
  }
  const deployment = readDeployments(dataDir)[String(chainId)];
  if (!deployment) {
    throw new NimbleError('not_found', `no Nimble contract addresses for chain id ${chainId} in ${deploymentFile(dataDir)} (see docs/chain.md)`);
  }
  const client = makeChainClient(rpcUrl, chainId, false, deployment);
  if (!(await hasCode(client.public, deployment.nim))) {
    throw new NimbleError('not_found', `no NIM contract at ${deployment.nim} on chain ${chainId} (${rpcUrl}); check ${deploymentFile(dataDir)}`);
  }
  return client;
}

async function hasCode(pub: ChainClient['public'], address: Address): Promise<boolean> {
  const code = await pub.getCode({ address });
  return code !== undefined && code !== '0x';
}

/** Runs `fn` with an open chain session and always closes it (the local node is dumped and stopped). */
export async function withChain<T>(opts: OpenChainOptions, fn: (client: ChainClient) => Promise<T>): Promise<T> {
  const session = await openChain(opts);
  try {
    return await fn(session.client);
  } finally {
    await session.close();
  }
}
