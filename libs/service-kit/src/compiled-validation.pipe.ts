import { type ArgumentMetadata, ValidationPipe, type ValidationPipeOptions } from '@nestjs/common';
import type { TypeMetadata } from 'class-transformer';
// @ts-expect-error -- the package types this module at types/storage.d.ts, not beside its CommonJS file.
import { defaultMetadataStorage as untypedTransformerStorage } from 'class-transformer/cjs/storage.js';
import type { MetadataStorage as TransformerStorage } from 'class-transformer/types/MetadataStorage.js';
import { getMetadataStorage, type ValidationArguments, ValidationTypes } from 'class-validator';
import type { ValidationMetadata } from 'class-validator/types/metadata/ValidationMetadata.js';

/** class-transformer's own metadata (@Type, @Expose, …): what plainToInstance reads. */
const transformerStorage = untypedTransformerStorage as TransformerStorage;
const validatorStorage = getMetadataStorage();
/** class-transformer's TransformationType.PLAIN_TO_CLASS. */
const PLAIN_TO_CLASS = 0;

type Class = new () => object;
/** A class as the metadata stores key it (class-validator types it as Function). */
type AnyClass = abstract new (...args: never[]) => unknown;
type Sync = (value: unknown, args: ValidationArguments) => boolean | Promise<boolean>;

interface Rule {
  metadata: ValidationMetadata;
  validate: Sync;
}

interface PropertyPlan {
  name: string;
  /** @IsOptional / @ValidateIf: the property's rules apply only when all of these hold. */
  conditions: ((object: object, value: unknown) => boolean)[];
  rules: Rule[];
  nested: boolean;
}

/** A class's rules, looked up and grouped once: what class-validator's executor does again on every call. */
interface ClassPlan {
  properties: Map<string, PropertyPlan>;
}

/**
 * The global ValidationPipe, with class-validator's metadata planned once per DTO class instead of looked up, filtered
 * and grouped on every request (with class-transformer's walk, 9 % of a create's JavaScript in a profile of the bench's create row).
 *
 * The decorators stay the DTO's one source of truth, and the plan calls their own constraint functions: only the walk
 * is compiled. A body the plan finds valid becomes the instance plainToInstance would build; anything else (invalid,
 * or a shape or decorator the plan does not cover) goes through ValidationPipe itself, so every 400 and its messages
 * are class-validator's. Trusting the plan only when it says "valid" means it can cost a refusal speed, never let
 * through what class-validator refuses (src/common/compiled-validation.pipe.spec.ts holds the two to agreement).
 */
export class CompiledValidationPipe extends ValidationPipe {
  private readonly plans = new Map<AnyClass, ClassPlan | null>();
  /** Whether the options are ones the plan reproduces; otherwise every value goes to ValidationPipe. */
  private readonly plannable: boolean;

  constructor(options: ValidationPipeOptions) {
    super(options);
    const { groups, always, strictGroups, whitelist, forbidNonWhitelisted } = this.validatorOptions;
    const { skipMissingProperties, skipNullProperties, skipUndefinedProperties } = this.validatorOptions;
    this.plannable =
      options.transform === true &&
      options.validatorPackage === undefined &&
      options.transformerPackage === undefined &&
      options.expectedType === undefined &&
      this.transformOptions === undefined &&
      !groups?.length &&
      !always &&
      !strictGroups &&
      !skipMissingProperties &&
      !skipNullProperties &&
      !skipUndefinedProperties &&
      // Whitelisting that strips (rather than refuses) changes the value: left to class-validator.
      (!whitelist || forbidNonWhitelisted === true);
  }

  override transform(value: unknown, metadata: ArgumentMetadata): Promise<unknown> {
    const planned = this.compiledTransform(value, metadata);
    return planned ? Promise.resolve(planned) : super.transform(value, metadata);
  }

  /**
   * The DTO instance when the plan finds the value valid; undefined when ValidationPipe must decide (invalid, or not
   * covered). Public for the agreement test.
   */
  compiledTransform(value: unknown, metadata: ArgumentMetadata): object | undefined {
    const { metatype } = metadata;
    if (!this.plannable || !metatype || !this.toValidate(metadata) || !isPlainObject(value)) return undefined;
    const instance = this.build(metatype as Class, value);
    return instance && this.valid(instance) ? instance : undefined;
  }

  /**
   * plainToInstance(cls, plain) for the values a valid body holds (primitives, and objects or arrays of objects under
   * @Type), as class-transformer builds it: `new cls()`, then each key in the body's order. Undefined for anything else.
   */
  private build(cls: Class, plain: Record<string, unknown>): object | undefined {
    if (!this.planOf(cls)) return undefined;
    const instance = new cls() as Record<string, unknown>;
    for (const key of Object.keys(plain)) {
      // Never copied by class-transformer, so never seen by the whitelist either.
      if (key === '__proto__' || key === 'constructor') continue;
      const descriptor = Object.getOwnPropertyDescriptor(cls.prototype, key);
      if ((descriptor && !descriptor.set) || instance[key] instanceof Function) continue;
      const sub = plain[key];
      const type = transformerStorage.findTypeMetadata(cls, key) as TypeMetadata | undefined;
      let built: unknown;
      if (sub === null || typeof sub !== 'object') {
        // null is copied whatever the type; another primitive under @Type is converted or not: class-transformer decides.
        if (type && sub !== null) return undefined;
        built = sub;
      } else {
        built = this.buildTyped(type, instance, plain, key, sub);
        if (built === undefined) return undefined;
      }
      if (built !== undefined) instance[key] = built;
    }
    return instance;
  }

  private buildTyped(type: TypeMetadata | undefined, instance: object, plain: object, key: string, sub: object): unknown {
    if (!type?.typeFunction || type.options?.discriminator) return undefined;
    const cls = type.typeFunction({ newObject: instance, object: plain, property: key }) as Class;
    if (!Array.isArray(sub)) return isPlainObject(sub) ? this.build(cls, sub) : undefined;
    // class-transformer makes the property's declared collection (a Set for a Set): only arrays are built here.
    if (type.reflectedType !== undefined && type.reflectedType !== Array) return undefined;
    const built: object[] = [];
    for (const element of sub as unknown[]) {
      const item = isPlainObject(element) ? this.build(cls, element) : undefined;
      if (!item) return undefined;
      built.push(item);
    }
    return built;
  }

  /** class-validator's verdict on an instance (ValidationExecutor.execute), without its messages. */
  private valid(object: object): boolean {
    const plan = this.planOf(object.constructor as AnyClass);
    if (!plan) return false;
    if (this.validatorOptions.whitelist) {
      for (const key of Object.keys(object)) if (!plan.properties.has(key)) return false;
    }
    for (const property of plan.properties.values()) {
      if (!this.validProperty(object, (object as Record<string, unknown>)[property.name], property)) return false;
    }
    return true;
  }

  private validProperty(object: object, value: unknown, property: PropertyPlan): boolean {
    for (const condition of property.conditions) if (!condition(object, value)) return true;
    for (const { metadata, validate } of property.rules) {
      if (metadata.validateIf && !metadata.validateIf(object, value)) continue;
      const { propertyName: property, constraints } = metadata;
      const args: ValidationArguments = { targetName: object.constructor.name, property, object, value, constraints };
      const verdicts = metadata.each && Array.isArray(value) ? value.map((item) => validate(item, args)) : [validate(value, args)];
      // A promise (an async constraint) is left to class-validator.
      if (!verdicts.every((verdict) => verdict === true)) return false;
    }
    return !property.nested || this.validNested(value);
  }

  /** @ValidateNested: undefined passes, arrays are walked element by element, objects validated as their own class. */
  private validNested(value: unknown): boolean {
    if (value === undefined) return true;
    if (Array.isArray(value)) return value.every((item) => this.validNested(item));
    return value instanceof Object && this.valid(value);
  }

  /** The class's plan, made on first use; null when a decorator or option is one the plan does not reproduce. */
  private planOf(cls: AnyClass): ClassPlan | undefined {
    let plan = this.plans.get(cls);
    if (plan === undefined) {
      plan = makePlan(cls);
      this.plans.set(cls, plan);
    }
    return plan ?? undefined;
  }
}

function makePlan(cls: AnyClass): ClassPlan | null {
  // As ValidationExecutor asks (no schema, no groups): the class's metadata and its ancestors'.
  const metadatas = validatorStorage.getTargetValidationMetadatas(cls, '', false, false, undefined);
  // No rules: class-validator answers "unknown value" (forbidUnknownValues) or nothing; either way not planned.
  if (!metadatas.length) return null;
  // @Expose/@Exclude/@Transform change what plainToInstance builds.
  if (transformerStorage.getExposedMetadatas(cls).length || transformerStorage.getExcludedMetadatas(cls).length) return null;
  const properties = new Map<string, PropertyPlan>();
  for (const metadata of metadatas) {
    const name = metadata.propertyName;
    if (transformerStorage.findTransformMetadatas(cls, name, PLAIN_TO_CLASS).length) return null;
    let property = properties.get(name);
    if (!property) properties.set(name, (property = { name, conditions: [], rules: [], nested: false }));
    switch (metadata.type) {
      case ValidationTypes.WHITELIST:
        break;
      case ValidationTypes.CONDITIONAL_VALIDATION:
        property.conditions.push(metadata.constraints[0] as PropertyPlan['conditions'][number]);
        break;
      case ValidationTypes.NESTED_VALIDATION:
        property.nested = true;
        break;
      case ValidationTypes.IS_DEFINED:
      case ValidationTypes.CUSTOM_VALIDATION: {
        if (!metadata.constraintCls) return null;
        for (const constraint of validatorStorage.getTargetValidatorConstraints(metadata.constraintCls)) {
          if (constraint.async) return null;
          const { instance } = constraint;
          property.rules.push({ metadata, validate: (value, args) => instance.validate(value, args) });
        }
        break;
      }
      default:
        // PROMISE_VALIDATION and anything newer.
        return null;
    }
  }
  return { properties };
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && Object.getPrototypeOf(value) === Object.prototype;
}
