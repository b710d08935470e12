// A typed client of the orchestrator's public API: what the CLI, the
// benchmarks and the tests use to talk to an orchestrator. Every answer is
// validated against the schema the server declares (./schemas.ts); a refusal
// comes back as the server's NimbleError.
import { Type } from '@sinclair/typebox';
import { JsonClient } from '../http/client.ts';
import { EpochList, EpochView, Health, MinerView, RunView, WorkTotal, type CreateRunRequest } from './schemas.ts';

const RunList = Type.Array(RunView);
const MinerList = Type.Array(MinerView);
const WorkList = Type.Array(WorkTotal);

export class OrchestratorClient {
  private readonly http: JsonClient;

  constructor(baseUrl: string | URL, timeoutMs = 15_000) {
    this.http = new JsonClient(baseUrl, timeoutMs, 'the orchestrator');
  }

  get url(): string {
    return this.http.baseUrl.href.replace(/\/$/, '');
  }

  health(): Promise<{ ok: true }> {
    return this.http.get('/health', Health, 'health');
  }

  miners(): Promise<MinerView[]> {
    return this.http.get('/miners', MinerList, 'miner list');
  }

  runs(): Promise<RunView[]> {
    return this.http.get('/runs', RunList, 'run list');
  }

  run(id: string): Promise<RunView> {
    return this.http.get(`/runs/${encodeURIComponent(id)}`, RunView, 'run');
  }

  createRun(request: CreateRunRequest): Promise<RunView> {
    return this.http.post('/runs', request, RunView, 'run');
  }

  /** The whole model from the stages' latest merged states (safetensors bytes). */
  checkpoint(runId: string): Promise<Uint8Array> {
    return this.http.bytes(`/runs/${encodeURIComponent(runId)}/checkpoint`);
  }

  work(): Promise<WorkTotal[]> {
    return this.http.get('/work', WorkList, 'work totals');
  }

  epochs(): Promise<EpochList> {
    return this.http.get('/epochs', EpochList, 'epoch list');
  }

  epoch(id: number): Promise<EpochView> {
    return this.http.get(`/epochs/${id}`, EpochView, 'epoch');
  }
}
