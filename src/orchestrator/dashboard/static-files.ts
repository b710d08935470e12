// The dashboard's built files (web/, bundled by scripts/build-web.mjs into dist/web at install):
// index.html and the files under assets/, looked up by a name checked
// against a strict pattern and resolved inside the build folder only (no
// directory traversal), served with their content type and caching headers
// (assets carry a content hash in their names: cached for a year; the page
// itself is revalidated every time), and a Content-Security-Policy that lets
// the page run its own scripts only.
import { readFile } from 'node:fs/promises';
import { extname, join, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Where `npm run build:web` puts the dashboard: dist/web at the project's root (from src/ or dist/ alike). */
export const DEFAULT_WEB_ROOT = fileURLToPath(new URL('../../../dist/web', import.meta.url));

/** The file names served under /assets/: a letter or digit first, then letters, digits, `_ . -`; never `..`. */
export const ASSET_NAME = '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$';

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.woff2': 'font/woff2',
  '.json': 'application/json',
  '.map': 'application/json',
};

/** What the page may load: its own scripts, styles and images, and requests to this server only. */
export const CONTENT_SECURITY_POLICY = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

export interface StaticFile {
  body: Buffer;
  headers: Record<string, string>;
}

export class StaticFiles {
  private readonly root: string;

  constructor(root: string = DEFAULT_WEB_ROOT) {
    this.root = resolve(root);
  }

  /** The page (index.html), or null when the dashboard was not built. */
  async page(): Promise<StaticFile | null> {
    const body = await this.read(join(this.root, 'index.html'));
    if (!body) return null;
    return { body, headers: { ...common(), 'content-type': TYPES['.html'], 'cache-control': 'no-cache', 'content-security-policy': CONTENT_SECURITY_POLICY } };
  }

  /** A file under assets/ by its name, or null (unknown, of a type not served, or a name that could leave the folder). */
  async asset(name: string): Promise<StaticFile | null> {
    if (!new RegExp(ASSET_NAME).test(name) || name.includes('..')) return null;
    const type = TYPES[extname(name).toLowerCase()];
    if (!type) return null;
    const dir = join(this.root, 'assets');
    const path = resolve(dir, name);
    if (!path.startsWith(dir + sep)) return null;
    const body = await this.read(path);
    if (!body) return null;
    return { body, headers: { ...common(), 'content-type': type, 'cache-control': 'public, max-age=31536000, immutable' } };
  }

  private async read(path: string): Promise<Buffer | null> {
    try {
      return await readFile(path);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOENT' || code === 'EISDIR' || code === 'ENOTDIR') return null;
      throw err;
    }
  }
}

function common(): Record<string, string> {
  return { 'x-content-type-options': 'nosniff', 'referrer-policy': 'same-origin', 'x-frame-options': 'DENY' };
}
