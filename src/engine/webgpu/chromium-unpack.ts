// Where @sparticuz/chromium unpacks its browser (and SwiftShader beside it):
// it uses `<tmpdir>/chromium` and reuses whatever is there, so on a machine
// with several users the first one's unpacked files (mode 700) stop everyone
// else's browser with EACCES. Each user gets a folder of its own instead,
// `<tmpdir>/nimble-chromium-<uid>`, for the one call that unpacks.
import { mkdirSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';

/** The folder this user's unpacked browser lives in. */
export function chromiumUnpackDir(): string {
  return join(tmpdir(), `nimble-chromium-${userInfo().uid}`);
}

/** `chromium.executablePath()`, unpacked into this user's own folder. */
export async function chromiumExecutablePath(chromium: { executablePath(input?: string): Promise<string> }): Promise<string> {
  const dir = chromiumUnpackDir();
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const saved = process.env.TMPDIR;
  process.env.TMPDIR = dir;
  try {
    return await chromium.executablePath();
  } finally {
    if (saved === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = saved;
  }
}
