// Real processes on loopback for network tests: an orchestrator and miners
// started through nbcli as child processes, with their data in a temp folder,
// all killed and removed at the end.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import Database from 'better-sqlite3';
import { generatePrivateKey } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import type { CreateRunRequest, EpochView, RunView } from '../../src/api/schemas.ts';
import type { Kind } from '../helpers/byzantine.ts';
import { nbcliArgv } from '../helpers/nbcli.ts';

const root = new URL('../..', import.meta.url).pathname;
const BYZANTINE_MINER = join(root, 'test/helpers/byzantine-miner.ts');

export interface Proc {
  child: ChildProcess;
  lines: string[];
  /** resolves with the first stdout JSON object that matches */
  waitFor(pred: (v: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
}

export class Cluster {
  readonly dir = mkdtempSync(join(tmpdir(), 'nimble-net-'));
  readonly procs: Proc[] = [];
  url = '';
  /** the orchestrator's dashboard login URL (its operator token) */
  loginUrl = '';
  orchestrator: Proc | null = null;
  port = 0;

  spawnNbcli(args: string[], home: string): Proc {
    const [node, ...pre] = nbcliArgv();
    return this.spawnProcess(node, [...pre, ...args, '--json'], home);
  }

  /** Runs an nbcli command to its end: its exit code, the JSON lines it printed, and its stderr. */
  async nbcli(args: string[], home: string): Promise<{ code: number | null; out: Record<string, unknown>[]; stderr: string }> {
    const p = this.spawnNbcli(args, home);
    // a spawn error ends it too (no 'exit' follows one)
    const code = await new Promise<number | null>((r) => (p.child.exitCode !== null ? r(p.child.exitCode) : (p.child.once('exit', (c) => r(c)), p.child.once('error', () => r(null)))));
    await new Promise((r) => setImmediate(r));
    const out: Record<string, unknown>[] = [];
    for (const line of p.lines.filter((l) => !l.startsWith('stderr: '))) {
      try {
        out.push(JSON.parse(line));
      } catch {
        // not JSON
      }
    }
    return { code, out, stderr: p.lines.filter((l) => l.startsWith('stderr: ')).join('\n') };
  }

  /** Runs a TypeScript file of the project in a child process (through tsx), its output collected like nbcli's. */
  spawnScript(script: string, args: string[], home: string): Proc {
    return this.spawnProcess(process.execPath, ['--import', 'tsx', script, ...args], home);
  }

  /** Starts a child process with NIMBLE_HOME=home, its stdout lines collected and JSON ones matched by waitFor. */
  private spawnProcess(command: string, args: string[], home: string): Proc {
    const child = spawn(command, args, {
      cwd: root,
      env: { ...process.env, NIMBLE_HOME: home },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const lines: string[] = [];
    const waiters: { pred: (v: Record<string, unknown>) => boolean; resolve: (v: Record<string, unknown>) => void }[] = [];
    createInterface({ input: child.stdout! }).on('line', (line) => {
      lines.push(line);
      let v: Record<string, unknown>;
      try {
        v = JSON.parse(line);
      } catch {
        return;
      }
      for (const w of [...waiters]) if (w.pred(v)) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve(v);
      }
    });
    createInterface({ input: child.stderr! }).on('line', (line) => lines.push(`stderr: ${line}`));
    // a process that cannot start (ENOENT, EACCES) is an error event, never an exit: kept as a line, and waitFor ends on it
    child.on('error', (err) => lines.push(`stderr: could not start ${command}: ${err.message}`));
    const proc: Proc = {
      child,
      lines,
      waitFor: (pred, timeoutMs = 60_000) =>
        new Promise((resolve, reject) => {
          for (const line of lines) {
            try {
              const v = JSON.parse(line);
              if (pred(v)) return resolve(v);
            } catch {
              // not JSON
            }
          }
          const t = setTimeout(() => reject(new Error(`timed out; output:\n${lines.slice(-20).join('\n')}`)), timeoutMs);
          waiters.push({ pred, resolve: (v) => (clearTimeout(t), resolve(v)) });
          child.once('exit', (code) => reject(new Error(`process exited (${code}); output:\n${lines.slice(-20).join('\n')}`)));
          child.once('error', (err) => reject(new Error(`process did not start: ${err.message}`)));
        }),
    };
    this.procs.push(proc);
    return proc;
  }

  /** Starts `nbcli orchestrator start`: unpaid (--no-chain) unless `chain` is set (the local anvil in its data dir). */
  async startOrchestrator(extra: string[] = [], opts: { chain?: boolean } = {}): Promise<void> {
    if (!this.port) this.port = await freePort();
    this.orchestrator = this.spawnNbcli(['orchestrator', 'start', '--port', String(this.port), ...(opts.chain ? [] : ['--no-chain']), ...extra], join(this.dir, 'orch'));
    const v = await this.orchestrator.waitFor((v) => v.event === 'listening');
    this.url = v.url as string;
    this.loginUrl = v.login as string;
  }

  async startMiner(name: string, extra: string[] = []): Promise<Proc> {
    const p = this.spawnNbcli(['miner', 'start', '--orchestrator', this.url, '--name', name, '--threads', '1', ...extra], join(this.dir, name));
    await p.waitFor((v) => v.event === 'started');
    return p;
  }

  /** Starts a miner of a Byzantine kind (test/helpers/byzantine.ts) in a process of its own, signing with <dir>/<name>/miner-key.json. */
  async startByzantine(name: string, kind: Kind): Promise<Proc> {
    const p = this.spawnScript(BYZANTINE_MINER, [this.url, join(this.dir, name), name, kind], join(this.dir, name));
    await p.waitFor((v) => v.event === 'started');
    return p;
  }

  /** the key of the developer who creates this cluster's runs */
  readonly developer = generatePrivateKey();

  /** The orchestrator's public API, as the cluster's developer. */
  get api(): OrchestratorClient {
    return (this.client ??= new OrchestratorClient(this.url, { wallet: this.developer }));
  }

  private client: OrchestratorClient | null = null;

  createRun(body: CreateRunRequest): Promise<RunView> {
    return this.api.createRun(body);
  }

  run(id: string): Promise<RunView> {
    return this.api.run(id);
  }

  /** Polls until pred(view) holds. */
  async waitRun(id: string, pred: (v: RunView) => boolean, timeoutMs = 120_000): Promise<RunView> {
    const end = Date.now() + timeoutMs;
    for (;;) {
      let v: RunView | undefined;
      try {
        v = await this.run(id);
      } catch {
        // orchestrator restarting
      }
      if (v && pred(v)) return v;
      if (Date.now() > end) throw new Error(`run ${id} did not get there: ${JSON.stringify(v)}`);
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  /** The charged entries of the orchestrator's work log with their reasons, read from its SQLite file (for a failed assertion's message). */
  chargedDetails(): string {
    const db = new Database(join(this.dir, 'orch', 'orchestrator', 'orchestrator.sqlite'), { readonly: true });
    try {
      const rows = db.prepare("SELECT miner_id, kind, stage, detail, at FROM work_log WHERE kind IN ('dropped', 'invalid', 'failed_check') ORDER BY at").all() as { detail: string | null }[];
      const out: string[] = [];
      for (const r of rows) {
        out.push(JSON.stringify(r));
        // a microbatch's story: its row and every hop claimed of it
        const id = /microbatch (\d+)/.exec(r.detail ?? '')?.[1];
        if (!id) continue;
        out.push(`  microbatch: ${JSON.stringify(db.prepare('SELECT * FROM microbatches WHERE id = ?').get(Number(id)))}`);
        for (const c of db.prepare('SELECT attempt, stage, phase, miner_id, next_id, at FROM hop_claims WHERE microbatch = ? ORDER BY attempt, at').all(Number(id))) out.push(`  claim: ${JSON.stringify(c)}`);
      }
      return out.join('\n');
    } finally {
      db.close();
    }
  }

  /** GET /epochs of the orchestrator. */
  async epochs(): Promise<EpochView[]> {
    return (await this.api.epochs()).epochs;
  }

  /** Stops the orchestrator with SIGTERM (it saves and stops the anvil node it runs), then everything else. */
  async stopGracefully(): Promise<void> {
    const orch = this.orchestrator?.child;
    if (orch && orch.exitCode === null && orch.signalCode === null) {
      const exited = new Promise((r) => orch.once('exit', r));
      orch.kill('SIGTERM');
      await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))]);
    }
    await this.stop();
  }

  async stop(): Promise<void> {
    await Promise.all(
      this.procs.map(
        (p) =>
          new Promise<void>((resolve) => {
            if (p.child.exitCode !== null || p.child.signalCode !== null) return resolve();
            p.child.once('exit', () => resolve());
            p.child.kill('SIGKILL');
          }),
      ),
    );
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}
