// The dashboard's live state: one EventSource on GET /events (server-sent
// events: a `hello`, then each section of the network's state whenever it
// changed, and new loss points), kept in a store that pages read and listen
// to. The browser reconnects by itself; a reconnect gets every section again.
import type { DashboardSection, DashboardSectionName, HelloEvent, LossEvent, LossPoint } from '../../src/api/dashboard.ts';

export type Store = { [K in DashboardSectionName]: DashboardSection<K> | null };
export type Listener = (changed: DashboardSectionName) => void;
export type LossListener = (key: string, points: LossPoint[]) => void;

const SECTIONS: readonly DashboardSectionName[] = ['miners', 'runs', 'jobs', 'epochs', 'models', 'deployments'];

export class Feed {
  readonly store: Store = { miners: null, runs: null, jobs: null, epochs: null, models: null, deployments: null };
  hello: HelloEvent | null = null;
  private readonly listeners = new Set<Listener>();
  private readonly lossListeners = new Set<LossListener>();
  private source: EventSource | null = null;

  constructor(private readonly onStatus: (status: 'live' | 'reconnecting') => void) {}

  connect(): void {
    const source = new EventSource('/events');
    this.source = source;
    source.onopen = () => this.onStatus('live');
    source.onerror = () => this.onStatus('reconnecting');
    source.addEventListener('hello', (e) => {
      const v = parse(e);
      if (isObject(v)) this.hello = v as HelloEvent;
    });
    for (const name of SECTIONS) {
      source.addEventListener(name, (e) => {
        const v = parse(e);
        // the server checks every section against its schema before sending it; here only its outer shape
        if (name === 'epochs' ? !isObject(v) || !Array.isArray((v as { epochs?: unknown }).epochs) : !Array.isArray(v)) return;
        (this.store as Record<DashboardSectionName, unknown>)[name] = v;
        for (const l of this.listeners) l(name);
      });
    }
    source.addEventListener('loss', (e) => {
      const v = parse(e) as LossEvent | null;
      if (!isObject(v) || !Array.isArray(v.series)) return;
      for (const s of v.series) if (typeof s.key === 'string' && Array.isArray(s.points)) for (const l of this.lossListeners) l(s.key, s.points);
    });
  }

  /** Calls `fn` after each section that arrives; returns the unsubscribe. */
  listen(fn: Listener): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  listenLoss(fn: LossListener): () => void {
    this.lossListeners.add(fn);
    return () => this.lossListeners.delete(fn);
  }

  close(): void {
    this.source?.close();
  }
}

function parse(e: Event): unknown {
  try {
    return JSON.parse((e as MessageEvent<string>).data);
  } catch {
    return null;
  }
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
