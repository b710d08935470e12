// A signed request's cost on one idle thread of this machine, for the
// calibration's merge rounds (src/sim/merge-time.ts MergeWork.requestMs):
// the miner's client (src/http/client.ts SignedClient, which the merge
// transport uses) and a real orchestrator's server in this one process; a
// joined miner downloads a blob of one merge frame's size (GET /blobs/:id:
// signature, who may read it, the blob read and its sha256 checked, the body sent) again and
// again. The median round trip, ms: the client's and the server's share
// together, which one process cannot tell apart. And the median wall time of
// storing a new blob of that size (MergeWork.putMs: written, fsynced,
// renamed, its folder fsynced), which an upload's reply waits for.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SignedClient } from '../src/http/client.ts';
import { startOrchestrator } from '../src/orchestrator/server.ts';
import { joinMiner } from './flood.bench.ts';
import { median } from './harness.ts';

export async function measureRequestMs(frameBytes: number, requests = 60): Promise<{ requestMs: number; putMs: number }> {
  const dir = mkdtempSync(join(tmpdir(), 'nimble-request-'));
  const orch = await startOrchestrator({ dataDir: join(dir, 'orch') });
  try {
    const signer = await joinMiner(orch);
    const client = new SignedClient(orch.url, signer);
    const blob = await orch.coordinator.blobs.put(new Uint8Array(frameBytes).map((_, i) => (i * 131) & 255));
    // a blob the miner may read (src/orchestrator/blobs/access.ts): one of its own, as a dataset it uploaded
    orch.coordinator.state.datasets.add({ sha256: blob, owner: signer.address, bytes: frameBytes, retentionMs: 3_600_000 }, Date.now());
    const times: number[] = [];
    for (let k = 0; k < requests + 5; k++) {
      const t0 = performance.now();
      const bytes = await client.request('GET', `/blobs/${blob}`);
      if (bytes.length !== frameBytes) throw new Error(`a blob of ${bytes.length} bytes came back for ${frameBytes}`);
      if (k >= 5) times.push(performance.now() - t0);
    }
    // a new blob each time (a blob already stored is not written again), as every upload of a round is
    const puts: number[] = [];
    for (let k = 0; k < 25; k++) {
      const bytes = new Uint8Array(frameBytes).map((_, i) => (i * 131 + k) & 255);
      const t0 = performance.now();
      await orch.coordinator.blobs.put(bytes);
      if (k >= 5) puts.push(performance.now() - t0);
    }
    return { requestMs: median(times), putMs: median(puts) };
  } finally {
    await orch.close();
    rmSync(dir, { recursive: true, force: true });
  }
}
