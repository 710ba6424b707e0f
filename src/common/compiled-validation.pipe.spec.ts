import { type ArgumentMetadata, HttpException, ValidationPipe, type ValidationPipeOptions } from '@nestjs/common';
import fc from 'fast-check';
import { isDeepStrictEqual } from 'node:util';
import { CreateOrderDto } from '../orders/dto/create-order.dto.js';
import { UpdateOrderDto } from '../orders/dto/update-order.dto.js';
import { CompiledValidationPipe, validationProblem } from '#service-kit';

/** The options http-app.ts gives the global pipe. */
const OPTIONS: ValidationPipeOptions = {
  whitelist: true,
  forbidNonWhitelisted: true,
  transform: true,
  forbidUnknownValues: true,
  exceptionFactory: validationProblem,
};

const reference = new ValidationPipe(OPTIONS);
const compiled = new CompiledValidationPipe(OPTIONS);
const body = (metatype: ArgumentMetadata['metatype']): ArgumentMetadata => ({ type: 'body', metatype, data: '' });

/** A body as the parser hands it over (structuredClone would make objects of another realm under Jest). */
const parsed = (value: unknown): unknown => (value === undefined ? undefined : JSON.parse(JSON.stringify(value)));

type Outcome = { ok: true; value: unknown } | { ok: false; problem: unknown };

async function outcomeOf(pipe: ValidationPipe, value: unknown, metadata: ArgumentMetadata): Promise<Outcome> {
  try {
    return { ok: true, value: await pipe.transform(parsed(value), metadata) };
  } catch (err) {
    if (!(err instanceof HttpException)) throw err;
    return { ok: false, problem: { status: err.getStatus(), body: err.getResponse() } };
  }
}

// Text near each rule's edges: visible ASCII or not, lengths around the limits, and the characters validator.js's
// isLength does not count (a variation selector, the second half of a surrogate pair).
const text = (max: number) =>
  fc.oneof(
    fc.string({ unit: fc.constantFrom('a', 'Z', '9', '-', ' ', '\uFE0F', '😀', 'é'), maxLength: max + 3 }),
    fc.string({ minLength: max - 2, maxLength: max + 2 }),
    fc.string({ maxLength: 8 }),
  );
const anyJson = fc.oneof(fc.constant(null), fc.boolean(), fc.integer(), fc.double(), fc.string({ maxLength: 4 }), fc.constantFrom({}, []));
const maybe = <T>(arb: fc.Arbitrary<T>) => fc.option(fc.oneof(arb, arb, arb, anyJson), { nil: undefined });
const whole = (min: number, max: number) =>
  fc.oneof(fc.integer({ min: min - 2, max: max + 2 }), fc.constantFrom(min, max, 1.5, -0, Number.MAX_SAFE_INTEGER));

const item = fc.record(
  {
    sku: maybe(fc.oneof(fc.stringMatching(/^[\x21-\x7E]{1,64}$/), text(64))),
    quantity: maybe(whole(1, 10_000)),
    unitPriceMinor: maybe(whole(0, 1_000_000_000)),
    extra: maybe(fc.string()),
  },
  { requiredKeys: [] },
);
const address = fc.record(
  {
    name: maybe(text(200)),
    line1: maybe(text(200)),
    line2: maybe(text(200)),
    city: maybe(text(100)),
    postalCode: maybe(text(20)),
    country: maybe(fc.constantFrom('GB', 'gb', 'GBR', 'DE')),
  },
  { requiredKeys: [] },
);
const createBody = fc.record(
  {
    orderNumber: maybe(fc.oneof(fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$/), text(65))),
    currency: maybe(fc.constantFrom('EUR', 'USD', 'eur', 'XXX', 'EURO', '')),
    items: maybe(fc.array(fc.oneof(item, item, item, anyJson), { maxLength: 4 })),
    shippingAddress: maybe(address),
    note: maybe(text(1000)),
    constructor: maybe(fc.string()),
    unknown: maybe(fc.string()),
  },
  { requiredKeys: [] },
);
// Bodies that are valid, or one field away from it, so that both verdicts come up often.
const visible = (min: number, max: number) =>
  fc.string({ unit: fc.constantFrom('a', 'Z', '9', '-', '~', '\uFE0F', '😀'), minLength: min, maxLength: max });
const goodItem = fc.record({
  sku: fc.stringMatching(/^[\x21-\x7E]{1,64}$/),
  quantity: fc.integer({ min: 1, max: 10_000 }),
  unitPriceMinor: fc.integer({ min: 0, max: 1e9 }),
});
const goodAddress = fc.record(
  {
    name: visible(0, 200),
    line1: visible(0, 200),
    line2: fc.option(visible(0, 200)),
    city: visible(0, 100),
    postalCode: visible(0, 20),
    country: fc.constant('GB'),
  },
  { requiredKeys: ['name', 'line1', 'city', 'postalCode', 'country'] },
);
const goodCreate = fc.record(
  {
    orderNumber: fc.option(fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$/)),
    currency: fc.constantFrom('EUR', 'USD', 'JPY'),
    items: fc.array(fc.oneof(goodItem, goodItem, goodItem, item), { minLength: 1, maxLength: 4 }),
    shippingAddress: fc.option(fc.oneof(goodAddress, goodAddress, address)),
    note: fc.option(fc.oneof(visible(0, 1000), text(1000))),
  },
  { requiredKeys: ['currency', 'items'] },
);
const updateBody = fc.record(
  { shippingAddress: maybe(fc.oneof(goodAddress, address)), note: maybe(text(1000)), other: maybe(fc.string()) },
  { requiredKeys: [] },
);

/**
 * The compiled plan and class-validator agree: where the plan says valid, ValidationPipe returns the same instance
 * (classes and own properties alike); where ValidationPipe refuses, the plan never says valid; and the pipe as a
 * whole answers exactly as ValidationPipe does, its problem+json messages included.
 */
async function agree(metatype: ArgumentMetadata['metatype'], value: unknown): Promise<'planned' | 'refused' | 'left'> {
  const expected = await outcomeOf(reference, value, body(metatype));
  const planned = compiled.compiledTransform(parsed(value), body(metatype));
  if (planned) {
    expect(expected.ok).toBe(true);
    expect(isDeepStrictEqual(planned, (expected as { value: unknown }).value)).toBe(true);
  }
  expect(await outcomeOf(compiled, value, body(metatype))).toEqual(expected);
  // A valid body is always planned, bar one shape class-validator accepts and the plan leaves to it (below).
  if (expected.ok && !planned) return 'left';
  return planned ? 'planned' : 'refused';
}

describe('CompiledValidationPipe', () => {
  it('plans a valid create: the same CreateOrderDto (nested classes included) that ValidationPipe builds', async () => {
    const valid = {
      orderNumber: 'PO-1',
      currency: 'EUR',
      items: [
        { sku: 'SKU-1', quantity: 2, unitPriceMinor: 1999 },
        { unitPriceMinor: 0, quantity: 10_000, sku: '~' },
      ],
      shippingAddress: { name: 'Ada', line1: '12 St James Square', city: 'London', postalCode: 'SW1Y 4JH', country: 'GB', line2: null },
      note: null,
    };
    const dto = compiled.compiledTransform(parsed(valid), body(CreateOrderDto));
    expect(dto).toBeInstanceOf(CreateOrderDto);
    expect(await agree(CreateOrderDto, valid)).toBe('planned');
    expect(await agree(CreateOrderDto, { currency: 'EUR', items: [{ sku: 'A', quantity: 1, unitPriceMinor: 1 }] })).toBe('planned');
  });

  it('leaves every refusal to class-validator: the same 400 and messages', async () => {
    for (const invalid of [
      {},
      { currency: 'EUR', items: [] },
      { currency: 'EUR', items: [{ sku: 'A', quantity: 0, unitPriceMinor: 1 }], extra: 1 },
      { currency: 'EUR', items: [{ sku: 'A', quantity: 1, unitPriceMinor: 1 }], note: 'x'.repeat(1001) },
      { currency: 'EUR', items: [null] },
      { currency: 'EUR', items: { sku: 'A' } },
    ]) {
      expect(compiled.compiledTransform(parsed(invalid), body(CreateOrderDto))).toBeUndefined();
      expect(await agree(CreateOrderDto, invalid)).toBe('refused');
    }
    // What is not a plain object, and a query, go to ValidationPipe whole.
    for (const value of [null, undefined, [], 'text', 3]) expect(await agree(CreateOrderDto, value)).not.toBe('planned');
  });

  it('agrees with class-validator on generated creates, valid and not', async () => {
    const seen = { planned: 0, refused: 0, left: 0 };
    await fc.assert(
      fc.asyncProperty(fc.oneof(goodCreate, createBody), async (value) => {
        const verdict = await agree(CreateOrderDto, value);
        seen[verdict]++;
        // class-validator walks an array inside items as if its elements were items (class-transformer builds them):
        // that one shape is valid to it and left to it by the plan.
        if (verdict === 'left') expect((value.items as unknown[]).some(Array.isArray)).toBe(true);
      }),
      { numRuns: 3000 },
    );
    // Both sides of the line were exercised.
    expect(seen.planned).toBeGreaterThan(100);
    expect(seen.refused).toBeGreaterThan(100);
  });

  it('agrees on generated updates (@ValidateIf, @IsObject, a nullable note)', async () => {
    const seen = { planned: 0, refused: 0, left: 0 };
    await fc.assert(
      fc.asyncProperty(updateBody, async (value) => {
        seen[await agree(UpdateOrderDto, value)]++;
      }),
      { numRuns: 1500 },
    );
    expect(seen.left).toBe(0);
    expect(seen.planned).toBeGreaterThan(50);
    expect(seen.refused).toBeGreaterThan(50);
  });
});
