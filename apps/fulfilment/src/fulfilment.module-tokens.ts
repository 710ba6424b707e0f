/** The validated configuration, as providers inject it. */
export const FULFILMENT_CONFIG = Symbol('FULFILMENT_CONFIG');
