// The Wallets page's data (docs/dashboard.md): the wallets of the data dir the
// orchestrator was started with (`<data-dir>/wallets`, where `nbcli wallet`
// keeps them), each with its balances on the orchestrator's chain. Only the
// name and address are read from a wallet file; its encrypted key is never
// opened. Balances are read afresh on each request, at most MAX_WALLETS.
import type { WalletsView } from '../../api/dashboard.ts';
import { readBalanceView } from '../../chain/balance-view.ts';
import type { ChainClient } from '../../chain/client.ts';
import { listWallets, walletsDir } from '../../chain/wallets.ts';

/** Wallets shown at most (the first by name). */
export const MAX_WALLETS = 100;

export async function readWallets(dataDir: string | null, chain: ChainClient | null): Promise<WalletsView> {
  if (dataDir === null) return { dir: null, chainId: chain?.chainId ?? null, wallets: [] };
  const list = listWallets(dataDir).slice(0, MAX_WALLETS);
  const wallets = await Promise.all(
    list.map(async (w) => {
      if (!chain) return { name: w.name, address: w.address, balance: null, error: null };
      try {
        const v = await readBalanceView(chain, w.address);
        return { name: w.name, address: w.address, balance: { free: v.free, staked: v.staked, unstaking: v.unstaking, rewardsTotal: v.rewardsTotal }, error: null };
      } catch (err) {
        return { name: w.name, address: w.address, balance: null, error: (err as Error).message.split('\n')[0].slice(0, 300) };
      }
    }),
  );
  return { dir: walletsDir(dataDir), chainId: chain?.chainId ?? null, wallets };
}
