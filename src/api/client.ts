// A typed client of the orchestrator's public API: what the CLI, the
// benchmarks and the tests use to talk to an orchestrator. Every answer is
// validated against the schema the server declares (./schemas.ts); a refusal
// comes back as the server's NimbleError. What a developer does with runs
// (create, cancel, download the checkpoint) is signed with the developer's
// wallet key, for the network the orchestrator proves it runs (./network.ts).
import { randomBytes } from 'node:crypto';
import { Type, type Static } from '@sinclair/typebox';
import type { Hex } from 'viem';
import { JsonClient, SignedClient } from '../http/client.ts';
import type { BaseUrls, Failover } from '../http/failover.ts';
import { NimbleError } from '../protocol/errors.ts';
import { parseJson } from '../protocol/messages.ts';
import { verifySignature } from '../protocol/session-key.ts';
import { RequestSigner } from '../protocol/signing.ts';
import { RunMerges } from './merges.ts';
import { chainMessage, findNetwork, type Network } from './network.ts';
import { ChainAnswer, EpochList, EpochView, Health, MinerView, RunView, WorkTotal, type ChainView, type CreateRunRequest } from './schemas.ts';

/** A developer's command waits this long for an unreachable orchestrator before it says so. */
const DEVELOPER_WAIT_MS = 3_000;

const RunList = Type.Array(RunView);
/**
 * The miner list as orchestrators of every version send it: those from before
 * the WebGPU backend send no backend, adapter or softwareAdapter (their
 * miners all run on WASM), so those are optional here and filled in.
 */
export const MinerListWire = Type.Array(
  Type.Object({
    ...MinerView.properties,
    backend: Type.Optional(MinerView.properties.backend),
    adapter: Type.Optional(MinerView.properties.adapter),
    softwareAdapter: Type.Optional(MinerView.properties.softwareAdapter),
  }),
);

/** A miner list from any orchestrator version, as today's MinerView. */
export function minersFromWire(list: Static<typeof MinerListWire>): MinerView[] {
  return list.map((m) => ({ ...m, backend: m.backend ?? 'wasm', adapter: m.adapter ?? null, softwareAdapter: m.softwareAdapter ?? false }));
}
const WorkList = Type.Array(WorkTotal);

export interface OrchestratorClientOptions {
  timeoutMs?: number;
  /** the developer's wallet key: signs what a developer does with runs */
  wallet?: Hex;
  /** the network, when the caller has already found it (a miner): otherwise asked for when needed */
  network?: Network;
}

export class OrchestratorClient {
  readonly http: JsonClient;
  private developer: Promise<SignedClient> | null = null;
  private network: Promise<Network> | null = null;

  constructor(
    /** the orchestrator: one URL, several of one network (src/http/failover.ts), or the Failover of other clients of it */
    baseUrl: BaseUrls | Failover,
    private readonly options: OrchestratorClientOptions = {},
  ) {
    this.http = new JsonClient(baseUrl, options.timeoutMs ?? 15_000, 'the orchestrator');
  }

  /** The orchestrator URL requests go to now. */
  get url(): string {
    return this.http.baseUrl.href.replace(/\/$/, '');
  }

  /** The network the orchestrator proves it runs (its key, for a fresh challenge). */
  private findNetwork(): Promise<Network> {
    const known = this.options.network;
    this.network ??= known ? Promise.resolve(known) : findNetwork(this.http.failover, () => false, DEVELOPER_WAIT_MS);
    return this.network;
  }

  /** Whether it has a developer key to sign with. */
  get canSign(): boolean {
    return this.options.wallet !== undefined;
  }

  /** The client that signs as the developer, for the network the orchestrator proved. */
  signed(): Promise<SignedClient> {
    const wallet = this.options.wallet;
    if (!wallet) return Promise.reject(new NimbleError('invalid', 'this needs a developer key (a wallet) to sign with'));
    const orchestrators = this.http.failover;
    this.developer ??= this.findNetwork().then(({ domain }) => new SignedClient(orchestrators, new RequestSigner(wallet, { domain }), this.options.timeoutMs));
    return this.developer;
  }

  /**
   * The chain the orchestrator pays on, signed with its network's key for a
   * fresh challenge: null when the network is unpaid, undefined when the
   * orchestrator is from before GET /chain (it does not say).
   */
  async chain(): Promise<ChainView | null | undefined> {
    const { orchestratorKey } = await this.findNetwork();
    const challenge = randomBytes(16).toString('hex');
    let answer: ChainAnswer;
    try {
      answer = await this.http.get(`/chain?challenge=${challenge}`, ChainAnswer, 'chain');
    } catch (err) {
      if (err instanceof NimbleError && err.status === 404) return undefined;
      throw err;
    }
    if (!answer.signature || !verifySignature(orchestratorKey, chainMessage(challenge, answer.chain), answer.signature)) {
      throw new NimbleError('forbidden', `${this.url} named its chain without its network's signature: refused`);
    }
    return answer.chain;
  }

  health(): Promise<{ ok: true }> {
    return this.http.get('/health', Health, 'health');
  }

  miners(): Promise<MinerView[]> {
    return this.http.get('/miners', MinerListWire, 'miner list').then(minersFromWire);
  }

  runs(): Promise<RunView[]> {
    return this.http.get('/runs', RunList, 'run list');
  }

  run(id: string): Promise<RunView> {
    return this.http.get(`/runs/${encodeURIComponent(id)}`, RunView, 'run');
  }

  /** A new run, owned by the developer. */
  async createRun(request: CreateRunRequest): Promise<RunView> {
    return (await this.signed()).postJson('/runs', request, RunView, 'run');
  }

  /** Ends one of the developer's runs. */
  async cancelRun(id: string): Promise<RunView> {
    return parseJson(RunView, await (await this.signed()).request('POST', `/runs/${encodeURIComponent(id)}/cancel`), 'run');
  }

  /** The whole model of one of the developer's runs, from the stages' latest merged states (safetensors bytes). */
  async checkpoint(runId: string): Promise<Uint8Array> {
    return (await this.signed()).request('GET', `/runs/${encodeURIComponent(runId)}/checkpoint`);
  }

  work(): Promise<WorkTotal[]> {
    return this.http.get('/work', WorkList, 'work totals');
  }

  /** A run's work log summed per miner and kind. */
  runWork(id: string): Promise<WorkTotal[]> {
    return this.http.get(`/runs/${encodeURIComponent(id)}/work`, WorkList, 'run work totals');
  }

  /** A run's merge rounds the orchestrator keeps, newest first (at most 200). */
  runMerges(id: string): Promise<RunMerges> {
    return this.http.get(`/runs/${encodeURIComponent(id)}/merges`, RunMerges, 'run merge rounds');
  }

  epochs(): Promise<EpochList> {
    return this.http.get('/epochs', EpochList, 'epoch list');
  }

  epoch(id: number): Promise<EpochView> {
    return this.http.get(`/epochs/${id}`, EpochView, 'epoch');
  }
}
