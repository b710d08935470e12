// Which chain is which (docs/chain.md, "Whose chain"): two local anvil nodes
// of two data dirs both have chain id 31337 and the same contract addresses,
// so neither tells them apart. A chain's identity is its id, the hash of its
// genesis block and the hash of the block its Nimble contracts were deployed
// in (a fresh local chain is salted before that block, ./session.ts, so two
// nodes started in the same second differ there too). An orchestrator names
// its chain by that identity and its contracts (GET /chain); a command or a
// miner that pays or checks on its behalf opens the chain it names only
// after reading the same identity and the contracts' code there.
import { getAddress, type Address, type Hex } from 'viem';
import { NimbleError } from '../protocol/errors.ts';
import { jobEscrowAbi, rewardDistributorAbi, stakingAbi } from './abis.ts';
import { LOCAL_CHAIN_ID } from './anvil.ts';
import { chainDefinition, createChainPublicClient, makeChainClient, type ChainClient, type Deployment } from './client.ts';

export interface ChainIdentity {
  chainId: number;
  /** hash of block 0 */
  genesisHash: Hex;
  /** hash of the block the contracts were deployed in (their `deployBlock`) */
  deployBlockHash: Hex;
}

/** A chain as an orchestrator names it: its identity, where to reach it, and its Nimble contracts. */
export interface ChainClaim extends ChainIdentity {
  /** the RPC URL the orchestrator publishes (null: none; a node on 127.0.0.1 is only reachable on its machine) */
  rpcUrl: string | null;
  /** the local anvil node of the orchestrator's data dir: faucet and gas top-ups there */
  local: boolean;
  contracts: Deployment;
}

type PublicReader = ChainClient['public'];

/** The identity of the chain `pub` reads, its contracts deployed at `deployBlock`. */
export async function readChainIdentity(pub: PublicReader, deployBlock: string): Promise<ChainIdentity> {
  const [chainId, genesis, deployed] = await Promise.all([
    pub.getChainId(),
    pub.getBlock({ blockNumber: 0n }),
    pub.getBlock({ blockNumber: BigInt(deployBlock) }).catch(() => null),
  ]);
  if (!genesis.hash) throw new NimbleError('unreachable', 'the chain answered block 0 without a hash');
  // a chain that does not have the block yet (or any more) has no hash there: it is not the chain named
  return { chainId, genesisHash: genesis.hash, deployBlockHash: deployed?.hash ?? ('0x' as Hex) };
}

/** The identity of the chain a client is on. */
export function chainIdentityOf(client: ChainClient): Promise<ChainIdentity> {
  return readChainIdentity(client.public, client.deployment.deployBlock);
}

export function sameChain(a: ChainIdentity, b: ChainIdentity): boolean {
  return a.chainId === b.chainId && a.genesisHash.toLowerCase() === b.genesisHash.toLowerCase() && a.deployBlockHash.toLowerCase() === b.deployBlockHash.toLowerCase();
}

const short = (h: Hex): string => (h.length > 14 ? `${h.slice(0, 10)}…${h.slice(-4)}` : h);

/**
 * "rpc URL, chain 31337, genesis 0xab12…": what a person needs to tell two
 * chains apart (no rpc part when `rpcUrl` is undefined). Against `other`, the
 * chain id is said only when it differs, and the contracts' block when the
 * genesis hashes are the same.
 */
export function describeChain(rpcUrl: string | null | undefined, id: ChainIdentity, other?: ChainIdentity): string {
  const parts = rpcUrl === undefined ? [] : [`rpc ${rpcUrl ?? '(none published)'}`];
  if (!other || other.chainId !== id.chainId) parts.push(`chain ${id.chainId}`);
  parts.push(`genesis ${short(id.genesisHash)}`);
  if (other && other.genesisHash.toLowerCase() === id.genesisHash.toLowerCase() && other.deployBlockHash.toLowerCase() !== id.deployBlockHash.toLowerCase()) {
    parts.push(`contracts' block ${short(id.deployBlockHash)}`);
  }
  return parts.join(', ');
}

function isLoopback(rpcUrl: string): boolean {
  try {
    const host = new URL(rpcUrl).hostname;
    return host === '127.0.0.1' || host === 'localhost' || host === '[::1]';
  } catch {
    return false;
  }
}

function httpUrl(rpcUrl: string, flag: string): string {
  let url: URL;
  try {
    url = new URL(rpcUrl);
  } catch {
    throw new NimbleError('invalid', `${flag} must be an http(s) URL, got '${rpcUrl}'`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new NimbleError('invalid', `${flag} must be an http(s) URL, got '${rpcUrl}'`);
  return rpcUrl;
}

export interface OpenClaimedChainOptions {
  /** the node to use instead of the orchestrator's (--chain-rpc): it must be the same chain */
  rpcUrl?: string;
  /** who is asking, for the messages: "this command", "this miner" */
  who: string;
  /** the Nimble contracts the asker's data dir records per chain id (deployment.json): on the same chain they must be the orchestrator's */
  known?: Record<string, Deployment>;
  /** where `known` comes from, for the messages */
  knownFile?: string;
}

/**
 * A client of the chain `claim` names, after checking it is that chain: on
 * `opts.rpcUrl` when given (the asker's own node), else on the claim's RPC:
 * the same chain id, genesis hash and deployment block hash, and each
 * contract's code, NIM being the token of Staking, RewardDistributor and
 * JobEscrow. Anything else is refused with one line that says which chain
 * each side is on; nothing is sent to the chain before.
 */
export async function openClaimedChain(claim: ChainClaim, opts: OpenClaimedChainOptions): Promise<ChainClient> {
  const theirs = (other?: ChainIdentity): string => describeChain(claim.rpcUrl, claim, other);
  const own = opts.rpcUrl ? httpUrl(opts.rpcUrl, '--chain-rpc') : undefined;
  const rpcUrl = own ?? claim.rpcUrl;
  if (!rpcUrl) {
    throw new NimbleError('conflict', `the orchestrator pays on chain ${claim.chainId} (genesis ${short(claim.genesisHash)}) and publishes no RPC URL for it: pass --chain-rpc URL of a node of that chain`);
  }
  const pub = createChainPublicClient(chainDefinition(claim.chainId, rpcUrl, false), false);
  let seen: ChainIdentity;
  try {
    seen = await readChainIdentity(pub, claim.contracts.deployBlock);
  } catch (err) {
    const why = (err as Error).message.split('\n')[0];
    if (own) throw new NimbleError('unreachable', `cannot reach the chain at ${own} (--chain-rpc): ${why}`);
    throw new NimbleError(
      'unreachable',
      `cannot reach the orchestrator's chain (${theirs()}) from here: ${why}; a node on 127.0.0.1 is reachable only on the orchestrator's machine: pass --chain-rpc URL of a node of that chain`,
    );
  }
  if (!sameChain(seen, claim)) {
    if (own) {
      const hint = claim.rpcUrl ? `pass --chain-rpc ${claim.rpcUrl} or leave --chain-rpc (and $NIMBLE_CHAIN_RPC) out to use the orchestrator's` : "pass --chain-rpc URL of a node of the orchestrator's chain";
      throw new NimbleError('conflict', `${opts.who}'s chain (${describeChain(own, seen, claim)}) is not the orchestrator's (${theirs(seen)}): ${hint}`);
    }
    throw new NimbleError('conflict', `the orchestrator says it pays on ${theirs(seen)}, and that RPC is another chain (${describeChain(undefined, seen, claim)}): refused; pass --chain-rpc URL of a node of the orchestrator's chain`);
  }
  const where = `on chain ${claim.chainId} (rpc ${rpcUrl})`;
  const known = opts.known?.[String(claim.chainId)];
  if (known) {
    const names = ['nim', 'staking', 'rewardDistributor', 'modelRegistry', 'jobEscrow'] as const;
    const differs = names.filter((n) => known[n] !== undefined && claim.contracts[n] !== undefined && getAddress(known[n]!) !== getAddress(claim.contracts[n]!));
    if (differs.length) {
      const list = (d: Deployment): string => differs.map((n) => `${n} ${d[n]}`).join(', ');
      throw new NimbleError('conflict', `${opts.knownFile ?? 'deployment.json'} records other Nimble contracts ${where} (${list(known)}) than the orchestrator's (${list(claim.contracts)}): refused`);
    }
  }
  const client = makeChainClient(rpcUrl, claim.chainId, claim.local && claim.chainId === LOCAL_CHAIN_ID && isLoopback(rpcUrl), claim.contracts);
  await checkContracts(client, where);
  return client;
}

/** Each contract of the client's deployment has code, and NIM is the token of the others (Staking that of the escrow and the distributor). */
async function checkContracts(client: ChainClient, where: string): Promise<void> {
  const d = client.deployment;
  const named: [string, Address | undefined][] = [['NIM', d.nim], ['Staking', d.staking], ['RewardDistributor', d.rewardDistributor], ['ModelRegistry', d.modelRegistry], ['JobEscrow', d.jobEscrow]];
  for (const [name, address] of named) {
    if (!address) continue;
    const code = await client.public.getCode({ address });
    if (code === undefined || code === '0x') throw new NimbleError('conflict', `the orchestrator names ${name} ${address} ${where}, and there is no contract there: refused`);
  }
  const pub = client.public;
  const links: [string, Address, string, Address, () => Promise<Address>][] = [
    ['Staking', d.staking, 'token', d.nim, () => pub.readContract({ address: d.staking, abi: stakingAbi, functionName: 'token' })],
    ['RewardDistributor', d.rewardDistributor, 'token', d.nim, () => pub.readContract({ address: d.rewardDistributor, abi: rewardDistributorAbi, functionName: 'token' })],
    ['RewardDistributor', d.rewardDistributor, 'staking', d.staking, () => pub.readContract({ address: d.rewardDistributor, abi: rewardDistributorAbi, functionName: 'staking' })],
  ];
  const escrow = d.jobEscrow;
  if (escrow) {
    links.push(
      ['JobEscrow', escrow, 'token', d.nim, () => pub.readContract({ address: escrow, abi: jobEscrowAbi, functionName: 'token' })],
      ['JobEscrow', escrow, 'staking', d.staking, () => pub.readContract({ address: escrow, abi: jobEscrowAbi, functionName: 'staking' })],
    );
  }
  for (const [name, address, fn, want, read] of links) {
    const got = await read().catch(() => null);
    if (got === null) throw new NimbleError('conflict', `the orchestrator names ${name} ${address} ${where}, and the contract there is not one (no ${fn}()): refused`);
    if (getAddress(got) !== getAddress(want)) throw new NimbleError('conflict', `the orchestrator names ${name} ${address} ${where}, whose ${fn} is ${getAddress(got)}, not ${want}: refused`);
  }
}
