// How to start nbcli itself as a child process, from the built package or
// from source (tests run the TypeScript through tsx).
import { fileURLToPath } from 'node:url';

/** argv prefix that runs this nbcli: [node, (--import tsx,) main]. */
export function nbcliArgv(): string[] {
  const main = new URL('./main' + (import.meta.url.endsWith('.ts') ? '.ts' : '.js'), import.meta.url);
  const path = fileURLToPath(main);
  return main.pathname.endsWith('.ts') ? [process.execPath, '--import', 'tsx', path] : [process.execPath, path];
}
