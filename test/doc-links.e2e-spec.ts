/**
 * Every relative link in README.md and docs/ resolves: the file (or folder) it names exists, and a `#fragment` into a
 * Markdown file names one of its headings (GitHub's anchors). Links inside code blocks are code, not links.
 */
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';

const REPO = process.cwd();

function markdownFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return markdownFiles(path);
    return entry.name.endsWith('.md') ? [path] : [];
  });
}

/** The text outside fenced code blocks and inline code spans. */
function prose(markdown: string): string {
  return markdown.replace(/^(```|~~~)[\s\S]*?^\1/gm, '').replace(/`[^`\n]*`/g, '');
}

/** GitHub's anchor for a heading: lower-cased, punctuation dropped, spaces to hyphens. */
function anchorOf(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');
}

function anchorsIn(file: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  const text = readFileSync(file, 'utf8').replace(/^(```|~~~)[\s\S]*?^\1/gm, '');
  for (const [, heading] of text.matchAll(/^#{1,6}\s+(.+?)\s*#*$/gm)) {
    const base = anchorOf(heading.replace(/\[([^\]]*)\]\([^)]*\)/g, '$1'));
    const count = seen.get(base) ?? 0;
    seen.set(base, count + 1);
    anchors.add(count === 0 ? base : `${base}-${count}`);
  }
  for (const [, id] of text.matchAll(/<a\s+(?:name|id)="([^"]+)"/g)) anchors.add(id);
  return anchors;
}

/** Every relative link target of a Markdown file: inline `[text](target)` and reference `[label]: target`. */
function relativeLinks(file: string): string[] {
  const text = prose(readFileSync(file, 'utf8'));
  const targets = [
    ...[...text.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map((m) => m[1]),
    ...[...text.matchAll(/^\s*\[[^\]]+\]:\s+(\S+)/gm)].map((m) => m[1]),
  ];
  return targets.filter((t) => !/^[a-z][a-z0-9+.-]*:/i.test(t));
}

function brokenLinks(file: string): string[] {
  return relativeLinks(file).flatMap((target) => {
    const [path, fragment] = target.split('#', 2);
    const resolved = path === '' ? file : resolve(dirname(file), decodeURIComponent(path));
    if (!existsSync(resolved)) return [`${target} (no such file)`];
    if (fragment && resolved.endsWith('.md') && statSync(resolved).isFile() && !anchorsIn(resolved).has(fragment.toLowerCase())) {
      return [`${target} (no heading #${fragment})`];
    }
    return [];
  });
}

describe('relative links in README.md and docs/', () => {
  const files = [join(REPO, 'README.md'), ...markdownFiles(join(REPO, 'docs'))];

  it('finds the pages and their links', () => {
    expect(files.length).toBeGreaterThan(10);
    expect(files.flatMap(relativeLinks).length).toBeGreaterThan(100);
  });

  it.each(files.map((f) => [relative(REPO, f), f]))('%s: every relative link resolves', (_name, file) => {
    expect(brokenLinks(file)).toEqual([]);
  });

  it('a broken link is caught (the check itself can fail)', () => {
    const dir = mkdtempSync(join(tmpdir(), 'doc-links-'));
    try {
      const probe = join(dir, 'probe.md');
      writeFileSync(probe, '# Probe\n\n[gone](moved/away.ts) [here](#probe) [nowhere](probe.md#no-such-heading) `[code](not/a/link.md)`\n');
      expect(brokenLinks(probe)).toEqual(['moved/away.ts (no such file)', 'probe.md#no-such-heading (no heading #no-such-heading)']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
