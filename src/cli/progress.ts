// A one-line progress bar on stderr for a TTY; plain periodic lines otherwise.

export interface ProgressFields {
  done: number;
  total: number;
  /** extra "key value" text after the counter */
  text: string;
  /** milliseconds since the start */
  elapsedMs: number;
}

export class ProgressBar {
  private lastPrint = 0;
  private readonly tty: boolean;

  constructor(
    private readonly label: string,
    private readonly stream: NodeJS.WriteStream = process.stderr,
    private readonly width = 24,
  ) {
    this.tty = Boolean(stream.isTTY);
  }

  update(f: ProgressFields): void {
    const now = performance.now();
    const last = f.done >= f.total;
    if (!last && now - this.lastPrint < (this.tty ? 100 : 5000)) return;
    this.lastPrint = now;
    const frac = f.total > 0 ? Math.min(1, f.done / f.total) : 0;
    const fill = Math.round(frac * this.width);
    const bar = '='.repeat(Math.max(0, fill - 1)) + (fill > 0 ? (last ? '=' : '>') : '') + ' '.repeat(this.width - fill);
    const eta = f.done > 0 ? ((f.total - f.done) * f.elapsedMs) / f.done : NaN;
    const line = `${this.label} [${bar}] ${f.done}/${f.total} ${f.text} ETA ${formatDuration(eta)}`;
    if (this.tty) this.stream.write(`\r${line}\x1b[K${last ? '\n' : ''}`);
    else this.stream.write(line + '\n');
  }
}

export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms)) return '--:--';
  const s = Math.round(ms / 1000);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = String(s % 60).padStart(2, '0');
  return h > 0 ? `${h}:${String(m).padStart(2, '0')}:${sec}` : `${m}:${sec}`;
}
