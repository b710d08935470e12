// A connection to the chain Nimble Network uses: the RPC endpoint, its chain
// id, the contract addresses deployed there, and viem clients for it.
import {
  createPublicClient,
  createWalletClient,
  defineChain,
  http,
  type Account,
  type Address,
  type Chain,
  type PublicClient,
  type Transport,
  type WalletClient,
} from 'viem';

/** Where the contracts live on one chain (one entry of <data-dir>/chain/deployment.json). */
export interface Deployment {
  chainId: number;
  nim: Address;
  staking: Address;
  rewardDistributor: Address;
  modelRegistry: Address;
  /** JobEscrow (developers' job budgets); absent in a deployment.json written before it existed (see deploy.ts) */
  jobEscrow?: Address;
  /** admin of every contract */
  deployer: Address;
  /** holds ORCHESTRATOR_ROLE: settles epochs, slashes, manages the registry */
  orchestrator: Address;
  /** may mint NIM freely: only ever set on a local chain */
  faucet?: Address;
  /** block of the first deployment transaction (where event scans start) */
  deployBlock: string;
  unstakeCooldownSeconds: number;
  deployedAt: string;
}

export interface ChainClient {
  chainId: number;
  rpcUrl: string;
  /** the node nbcli runs itself (anvil): faucet and gas top-ups allowed */
  local: boolean;
  chain: Chain;
  public: PublicClient<Transport, Chain>;
  deployment: Deployment;
}

export type SigningClient = WalletClient<Transport, Chain, Account>;

export function chainDefinition(chainId: number, rpcUrl: string, local: boolean): Chain {
  return defineChain({
    id: chainId,
    name: local ? 'Nimble local chain' : `chain ${chainId}`,
    nativeCurrency: { name: 'Ether', symbol: 'ETH', decimals: 18 },
    rpcUrls: { default: { http: [rpcUrl] } },
  });
}

export function createChainPublicClient(chain: Chain, local: boolean): PublicClient<Transport, Chain> {
  return createPublicClient({
    chain,
    transport: http(chain.rpcUrls.default.http[0], { timeout: 60_000, retryCount: local ? 0 : 3 }),
    pollingInterval: local ? 25 : 1_000,
  });
}

export function makeChainClient(rpcUrl: string, chainId: number, local: boolean, deployment: Deployment): ChainClient {
  const chain = chainDefinition(chainId, rpcUrl, local);
  return { chainId, rpcUrl, local, chain, public: createChainPublicClient(chain, local), deployment };
}

/** A client that signs with `account` on the chain of `client`. */
export function signerFor(client: Pick<ChainClient, 'chain' | 'local'>, account: Account): SigningClient {
  return createWalletClient({
    account,
    chain: client.chain,
    transport: http(client.chain.rpcUrls.default.http[0], { timeout: 60_000, retryCount: client.local ? 0 : 3 }),
    pollingInterval: client.local ? 25 : 1_000,
  });
}
