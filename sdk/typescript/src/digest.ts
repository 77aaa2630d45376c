// The schema digest (docs/protocol.md, Toolrelay-Schema): the first 16 hex
// characters of the SHA-256 of the schema re-encoded as Go's encoding/json
// encodes a decoded value: object keys sorted by their UTF-8 bytes, no
// spaces, numbers kept exactly as written, strings escaped as Go escapes
// them ("<", ">", "&", U+2028 and U+2029 as \u escapes). A schema that is
// not JSON is hashed as it is, trimmed. The dispatcher puts this digest on
// every call it checked; an executor with the same digest need not check
// the arguments again.

import { createHash } from "node:crypto";

type Value =
  | { t: "lit"; s: string } // number, true, false, null: as written
  | { t: "str"; s: string }
  | { t: "arr"; v: Value[] }
  | { t: "obj"; v: Map<string, Value> };

class ParseError extends Error {}

/** schemaDigest returns the digest of the raw schema text. */
export function schemaDigest(raw: string): string {
  let canonical: string;
  try {
    canonical = encode(new Parser(raw).value());
  } catch (e) {
    if (!(e instanceof ParseError)) throw e;
    canonical = raw.trim();
  }
  return createHash("sha256").update(canonical, "utf8").digest("hex").slice(0, 16);
}

/** canonicalJSON is the text the digest hashes, for tests and debugging. */
export function canonicalJSON(raw: string): string {
  return encode(new Parser(raw).value());
}

class Parser {
  private i = 0;
  constructor(private readonly s: string) {}

  // value reads the first JSON value; like Go's json.Decoder.Decode, what
  // follows it is not read.
  value(): Value {
    this.ws();
    const c = this.s[this.i];
    if (c === "{") return this.object();
    if (c === "[") return this.array();
    if (c === '"') return { t: "str", s: this.string() };
    for (const lit of ["true", "false", "null"]) {
      if (this.s.startsWith(lit, this.i)) {
        this.i += lit.length;
        return { t: "lit", s: lit };
      }
    }
    const m = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/.exec(this.s.slice(this.i, this.i + 4096));
    if (!m || m[0] === "" || m[0] === "-") throw new ParseError("not JSON");
    this.i += m[0].length;
    return { t: "lit", s: m[0] };
  }

  private ws(): void {
    while (this.i < this.s.length && " \t\n\r".includes(this.s[this.i]!)) this.i++;
  }

  private expect(c: string): void {
    this.ws();
    if (this.s[this.i] !== c) throw new ParseError(`want ${c}`);
    this.i++;
  }

  private object(): Value {
    this.i++;
    const v = new Map<string, Value>();
    this.ws();
    if (this.s[this.i] === "}") {
      this.i++;
      return { t: "obj", v };
    }
    for (;;) {
      this.ws();
      if (this.s[this.i] !== '"') throw new ParseError("want key");
      const k = wellFormed(this.string());
      this.expect(":");
      v.set(k, this.value()); // a repeated key: the last wins, as in Go
      this.ws();
      const c = this.s[this.i++];
      if (c === "}") return { t: "obj", v };
      if (c !== ",") throw new ParseError("want , or }");
    }
  }

  private array(): Value {
    this.i++;
    const v: Value[] = [];
    this.ws();
    if (this.s[this.i] === "]") {
      this.i++;
      return { t: "arr", v };
    }
    for (;;) {
      v.push(this.value());
      this.ws();
      const c = this.s[this.i++];
      if (c === "]") return { t: "arr", v };
      if (c !== ",") throw new ParseError("want , or ]");
    }
  }

  private string(): string {
    const start = this.i;
    this.i++;
    for (;;) {
      if (this.i >= this.s.length) throw new ParseError("unterminated string");
      const c = this.s.charCodeAt(this.i);
      if (c === 0x22) break;
      if (c < 0x20) throw new ParseError("control character in string");
      if (c === 0x5c) {
        const e = this.s[this.i + 1];
        if (e === "u") {
          if (!/^[0-9a-fA-F]{4}$/.test(this.s.slice(this.i + 2, this.i + 6))) throw new ParseError("bad \\u escape");
          this.i += 6;
          continue;
        }
        if (e === undefined || !'"\\/bfnrt'.includes(e)) throw new ParseError("bad escape");
        this.i += 2;
        continue;
      }
      this.i++;
    }
    this.i++;
    return JSON.parse(this.s.slice(start, this.i)) as string;
  }
}

// wellFormed replaces lone surrogates with U+FFFD, as Go's decoder does.
function wellFormed(s: string): string {
  return s.replace(/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g, "\uFFFD");
}

function encode(v: Value): string {
  switch (v.t) {
    case "lit":
      return v.s;
    case "str":
      return encodeString(v.s);
    case "arr":
      return "[" + v.v.map(encode).join(",") + "]";
    case "obj": {
      const keys = [...v.v.keys()].sort((a, b) => Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8")));
      return "{" + keys.map((k) => encodeString(k) + ":" + encode(v.v.get(k)!)).join(",") + "}";
    }
  }
}

const short: Record<string, string> = { '"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t" };

function encodeString(s: string): string {
  let out = '"';
  for (const ch of wellFormed(s)) {
    const c = ch.codePointAt(0)!;
    if (short[ch] !== undefined) out += short[ch];
    else if (c < 0x20 || ch === "<" || ch === ">" || ch === "&" || c === 0x2028 || c === 0x2029) {
      out += "\\u" + c.toString(16).padStart(4, "0");
    } else out += ch;
  }
  return out + '"';
}
