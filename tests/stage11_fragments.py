#!/usr/bin/env python3
"""Stage 11's fragment layouts, lane by lane, without a GPU.

Emulates the warp-level paths of stages/11_backward_tc/backward_tc_kernel.cuh from the PTX ISA's
definitions of ldmatrix (.x4, .x4.trans) and mma.m16n8k16 (the layouts drawn in tensor_core.cuh):
a swizzled shared tile, the addresses each lane passes, the registers each lane receives, the mma's
A, B and accumulator fragments. It checks, with small integers (exact in floating point), that
  warp_gemm_abt      gives S^T = K Q^T (and S = Q K^T of dq_kernel),
  warp_gemm_acc_b    gives P^T dO from P^T's accumulators as A operands (and dQ += dS K of dq_kernel),
  the dS^T store and its ldmatrix.trans read-back give dk_dv_kernel's share of dQ = dS K,
for the kernel's tile shapes. The index expressions are copied from the kernel file: change them
there, change them here. A CPU test (ctest -L stage11); the GPU sweep is what proves the kernel.
"""
import random
random.seed(1)
VEC=8
def swz(width,row,col):
    cpr=width//VEC
    rpw=1 if cpr>=8 else 8//cpr
    pat=8 if cpr>=8 else cpr
    chunk=(col//VEC)^((row//rpw)%pat)
    return chunk*VEC+col%VEC
class Tile:
    def __init__(s,rows,width): s.rows=rows; s.w=width; s.phys=[[None]*width for _ in range(rows)]
    def set(s,r,c,x): s.phys[r][swz(s.w,r,c)]=x
    def get(s,r,c): return s.phys[r][swz(s.w,r,c)]
    def fill(s,M):
        for r in range(s.rows):
            for c in range(s.w): s.set(r,c,M[r][c])
def ldmatrix(tile,addr,trans):
    # addr(lane) -> (row, logical col); the code passes &tile[row][swizzled(row,col)]
    regs=[[None]*4 for _ in range(32)]
    for m in range(4):
        rows=[]
        for i in range(8):
            r,c=addr(8*m+i)
            p=swz(tile.w,r,c); assert p%8==0
            rows.append(tile.phys[r][p:p+8])
        for L in range(32):
            if not trans: regs[L][m]=(rows[L//4][2*(L%4)],rows[L//4][2*(L%4)+1])
            else: regs[L][m]=(rows[2*(L%4)][L//4],rows[2*(L%4)+1][L//4])
    return regs
def mma(acc,a,b0,b1):
    A=[[None]*16 for _ in range(16)]; B=[[None]*8 for _ in range(16)]
    for L in range(32):
        g,t=L//4,L%4
        for (rr,cc),pair in zip([(g,2*t),(g+8,2*t),(g,2*t+8),(g+8,2*t+8)],a[L]):
            A[rr][cc],A[rr][cc+1]=pair
        B[2*t][g],B[2*t+1][g]=b0[L]; B[2*t+8][g],B[2*t+9][g]=b1[L]
    for L in range(32):
        g,t=L//4,L%4
        for idx,(rr,cc) in enumerate([(g,2*t),(g,2*t+1),(g+8,2*t),(g+8,2*t+1)]):
            acc[L][idx]+=sum(A[rr][k]*B[k][cc] for k in range(16))
def zeros(nb): return [[[0.0]*4 for _ in range(nb)] for _ in range(32)]
def warp_gemm_abt(NB,DIM,a_tile,a_row,b_tile):
    acc=zeros(NB)
    for ks in range(DIM//16):
        a=ldmatrix(a_tile,lambda l:(a_row+l%16, ks*16+(l//16)*8),False)
        for nb in range(0,NB,2):
            b=ldmatrix(b_tile,lambda l:(nb*8+(l//16)*8+l%8, ks*16+((l//8)%2)*8),False)
            sub0=[x[nb] for x in acc]; sub1=[x[nb+1] for x in acc]
            mma(sub0,a,[b[L][0] for L in range(32)],[b[L][1] for L in range(32)])
            mma(sub1,a,[b[L][2] for L in range(32)],[b[L][3] for L in range(32)])
    return acc
def warp_gemm_acc_b(K,NB,b_tile,b_col,a_acc):
    acc=zeros(NB)
    for ks in range(K//16):
        a=[[(a_acc[L][2*ks][0],a_acc[L][2*ks][1]),(a_acc[L][2*ks][2],a_acc[L][2*ks][3]),
            (a_acc[L][2*ks+1][0],a_acc[L][2*ks+1][1]),(a_acc[L][2*ks+1][2],a_acc[L][2*ks+1][3])] for L in range(32)]
        for nb in range(0,NB,2):
            b=ldmatrix(b_tile,lambda l:(ks*16+((l//8)%2)*8+l%8, b_col+nb*8+(l//16)*8),True)
            sub0=[x[nb] for x in acc]; sub1=[x[nb+1] for x in acc]
            mma(sub0,a,[b[L][0] for L in range(32)],[b[L][1] for L in range(32)])
            mma(sub1,a,[b[L][2] for L in range(32)],[b[L][3] for L in range(32)])
    return acc
def acc_matrix(acc,rows,nb):  # accumulator layout -> 16 x nb*8 matrix (rows is always 16)
    M=[[None]*(nb*8) for _ in range(16)]
    for L in range(32):
        g,t=L//4,L%4
        for b in range(nb):
            for h in range(2):
                for e in range(2): M[g+8*h][b*8+2*t+e]=acc[L][b][2*h+e]
    return M
def rnd(r,c): return [[random.randint(-3,3) for _ in range(c)] for _ in range(r)]
def close(X,Y): return all(abs(x-y)<1e-9 for xr,yr in zip(X,Y) for x,y in zip(xr,yr))

for D,BR,WARPS in [(32,64,8),(64,64,8),(128,32,8),(64,32,4)]:
    BC=16*WARPS
    K=rnd(BC,D); Q=rnd(BR,D); DO=rnd(BR,D)
    kt=Tile(BC,D); kt.fill(K); qt=Tile(BR,D); qt.fill(Q); dot=Tile(BR,D); dot.fill(DO)
    dst=Tile(BC,BR)
    dS_full=[[None]*BR for _ in range(BC)]
    for w in range(WARPS):
        wk=16*w
        s=warp_gemm_abt(BR//8,D,kt,wk,qt)
        S=acc_matrix(s,16,BR//8)
        ref=[[sum(K[wk+i][c]*Q[j][c] for c in range(D)) for j in range(BR)] for i in range(16)]
        assert close(S,ref),("S^T",D,BR,w)
        # use S^T as "P^T" and check dV-style product P^T dO
        dv=warp_gemm_acc_b(BR,D//8,dot,0,s)
        ref2=[[sum(ref[i][j]*DO[j][c] for j in range(BR)) for c in range(D)] for i in range(16)]
        assert close(acc_matrix(dv,16,D//8),ref2),("dV",D,BR,w)
        # dS^T store (as the kernel writes it) from s
        for L in range(32):
            g,t=L//4,L%4
            for rb in range(BR//8):
                for h in range(2):
                    r=wk+g+8*h; c=rb*8+2*t
                    dst.set(r,c,s[L][rb][2*h]); dst.set(r,c+1,s[L][rb][2*h+1])
                    dS_full[r][c]=s[L][rb][2*h]; dS_full[r][c+1]=s[L][rb][2*h+1]
    assert all(x is not None for row in dst.phys for x in row)
    # dQ share: dS (= dS_full^T) times K
    rowtiles=BR//16; groups=WARPS//rowtiles; dqb=(D//8)//groups
    for w in range(WARPS):
        rt=w%rowtiles; cg=w//rowtiles; fd=cg*dqb*8
        acc=zeros(dqb)
        for ks in range(BC//16):
            a=ldmatrix(dst,lambda l:(ks*16+(l//16)*8+l%8, rt*16+((l//8)%2)*8),True)
            for nb in range(0,dqb,2):
                b=ldmatrix(kt,lambda l:(ks*16+((l//8)%2)*8+l%8, fd+nb*8+(l//16)*8),True)
                sub0=[x[nb] for x in acc]; sub1=[x[nb+1] for x in acc]
                mma(sub0,a,[b[L][0] for L in range(32)],[b[L][1] for L in range(32)])
                mma(sub1,a,[b[L][2] for L in range(32)],[b[L][3] for L in range(32)])
        M=acc_matrix(acc,16,dqb)
        ref=[[sum(dS_full[key][rt*16+i]*K[key][fd+c] for key in range(BC)) for c in range(dqb*8)] for i in range(16)]
        assert close(M,ref),("dQ share",D,BR,w)
    print("dk_dv fragment paths OK", D, BR, WARPS)

# dq_kernel: S = Q K^T per warp, then dQ += S K (acc as A, K transposed)
for D,BC in [(32,64),(128,64)]:
    BRQ=64
    K=rnd(BC,D); Q=rnd(BRQ,D)
    kt=Tile(BC,D); kt.fill(K); qt=Tile(BRQ,D); qt.fill(Q)
    for w in range(4):
        s=warp_gemm_abt(BC//8,D,qt,16*w,kt)
        S=acc_matrix(s,16,BC//8)
        ref=[[sum(Q[16*w+i][c]*K[j][c] for c in range(D)) for j in range(BC)] for i in range(16)]
        assert close(S,ref)
        dq=warp_gemm_acc_b(BC,D//8,kt,0,s)
        ref2=[[sum(ref[i][j]*K[j][c] for j in range(BC)) for c in range(D)] for i in range(16)]
        assert close(acc_matrix(dq,16,D//8),ref2)
    print("dq fragment paths OK", D, BC)
