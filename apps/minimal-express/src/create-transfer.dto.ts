import { IsInt, IsString, Length, Min } from 'class-validator';

export class CreateTransferDto {
  @IsString()
  @Length(1, 64)
  toAccount: string;

  @IsInt()
  @Min(1)
  amountMinor: number;
}
