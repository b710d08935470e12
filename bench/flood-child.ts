// The flood of the flood bench, in a process of its own (so that neither its
// CPU nor its memory is counted as the orchestrator's). argv: the
// orchestrator's URL, the mode ('mixed': forged session and wallet
// signatures, unsigned POST /runs and 100-200 MiB unsigned uploads;
// 'oversized': the uploads alone), and a joined miner's address (to forge
// its signatures). Prints {"event":"ready"} once under way, then floods until
// its stdin closes, and prints what it sent as one JSON line.
import { Agent, request } from 'node:http';
import { forgedHeaders, randomAddress, streamUpload } from '../test/helpers/http-flood.ts';

const [url, mode, victim] = process.argv.slice(2);
const MiB = 1 << 20;
let flooding = true;
process.stdin.on('end', () => void (flooding = false));
process.stdin.resume();

const statuses: Record<string, number> = {};
const count = (s: number | string): void => void (statuses[s] = (statuses[s] ?? 0) + 1);
let offered = 0;
let sent = 0;

/** One small request on a keep-alive connection: its status, or the error's code. */
function post(agent: Agent, path: string, headers: Record<string, string>, body: Uint8Array): Promise<void> {
  return new Promise((resolve) => {
    const r = request(`${url}${path}`, { method: 'POST', agent, headers: { ...headers, 'content-type': 'application/json', 'content-length': String(body.length) } }, (res) => {
      res.resume();
      res.on('end', () => (count(res.statusCode ?? 0), resolve()));
    });
    r.on('error', (err) => (count((err as NodeJS.ErrnoException).code ?? 'error'), resolve()));
    r.end(body);
  });
}

async function forgeries(agent: Agent): Promise<void> {
  const body = new TextEncoder().encode(JSON.stringify({ freeSlots: 3, queue: 0, reports: [] }));
  for (let i = 0; flooding; i++) {
    const kind = i % 3;
    if (kind === 0) await post(agent, '/miners/heartbeat', forgedHeaders('session', victim, body), body);
    else if (kind === 1) await post(agent, '/miners/join', forgedHeaders('wallet', randomAddress(), body), body);
    else await post(agent, '/runs', {}, new TextEncoder().encode(JSON.stringify({ model: 'gpt-tiny', data: 'moby-dick', steps: 1000 })));
  }
}

async function uploads(): Promise<void> {
  const routes = ['/runs/run-x/stages/0/rounds/1/state', '/miners/heartbeat', '/runs/run-x/checks/1', '/miners/join'];
  for (let i = 0; flooding; i++) {
    const size = (100 + ((i * 37) % 101)) * MiB;
    const r = await streamUpload(`${url}${routes[i % routes.length]}`, size);
    offered += size;
    sent += r.written;
    count(r.status ?? r.error ?? 'none');
  }
}

const agent = new Agent({ keepAlive: true, maxSockets: 8 });
const work = [...Array.from({ length: 2 }, () => uploads()), ...(mode === 'mixed' ? Array.from({ length: 8 }, () => forgeries(agent)) : [])];
process.stdout.write(`${JSON.stringify({ event: 'ready' })}\n`);
await Promise.all(work);
agent.destroy();
process.stdout.write(`${JSON.stringify({ event: 'done', statuses, offered, sent })}\n`);
