#!/usr/bin/env python3
"""Stage 11's fragment layouts, lane by lane, without a GPU.

Emulates the warp-level paths of stages/11_backward_tc/backward_tc_kernel.cuh from the PTX ISA's
definitions of ldmatrix (.x4, .x4.trans) and mma.m16n8k16 (the layouts drawn in tensor_core.cuh):
a swizzled shared tile, the addresses each lane passes, the registers each lane receives, the mma's
A, B and accumulator fragments. It checks, with small integers (exact in floating point), that
  warp_tile_abt      gives dk_dv_kernel's Br/2 x 32 warp tiles of S = Q K^T,
  the P store and warp_tile_ab's ldmatrix.trans read-back give its dV = P^T dO (and dK = dS^T Q),
  warp_tile_ab without the transpose gives its share of dQ = dS K, and DqShare's accumulator layout
  with convert_dq_kernel's index arithmetic gives every element of the share back in its row,
  warp_gemm_abt and warp_gemm_acc_b give dq_kernel's S = Q K^T and dQ += dS K,
for the kernels' tile shapes. The index expressions are copied from the kernel file: change them
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

def warp_tile_abt(MT,NB,DIM,a_tile,a_row,b_tile,b_row):
    acc=[zeros(NB) for _ in range(MT)]
    for ks in range(DIM//16):
        a=[ldmatrix(a_tile,lambda l:(a_row+m*16+l%16, ks*16+(l//16)*8),False) for m in range(MT)]
        for nb in range(0,NB,2):
            b=ldmatrix(b_tile,lambda l:(b_row+nb*8+(l//16)*8+l%8, ks*16+((l//8)%2)*8),False)
            for m in range(MT):
                sub0=[x[nb] for x in acc[m]]; sub1=[x[nb+1] for x in acc[m]]
                mma(sub0,a[m],[b[L][0] for L in range(32)],[b[L][1] for L in range(32)])
                mma(sub1,a[m],[b[L][2] for L in range(32)],[b[L][3] for L in range(32)])
    return acc
def warp_tile_ab(MT,NB,KK,a_trans,a_tile,a_row,b_tile,b_col):
    acc=[zeros(NB) for _ in range(MT)]
    for ks in range(KK//16):
        if a_trans:
            a=[ldmatrix(a_tile,lambda l:(ks*16+(l//16)*8+l%8, a_row+m*16+((l//8)%2)*8),True) for m in range(MT)]
        else:
            a=[ldmatrix(a_tile,lambda l:(a_row+m*16+l%16, ks*16+(l//16)*8),False) for m in range(MT)]
        for nb in range(0,NB,2):
            b=ldmatrix(b_tile,lambda l:(ks*16+((l//8)%2)*8+l%8, b_col+nb*8+(l//16)*8),True)
            for m in range(MT):
                sub0=[x[nb] for x in acc[m]]; sub1=[x[nb+1] for x in acc[m]]
                mma(sub0,a[m],[b[L][0] for L in range(32)],[b[L][1] for L in range(32)])
                mma(sub1,a[m],[b[L][2] for L in range(32)],[b[L][3] for L in range(32)])
    return acc
def tile_matrix(acc,nb):  # [m-tile][lane][n-block][4] -> (16 * m-tiles) x nb*8 matrix
    return [row for a in acc for row in acc_matrix(a,16,nb)]

BC,WARPS=128,8
for D,BR in [(32,64),(64,64),(128,64),(64,128)]:  # head_dim, query rows per step (128 at d64 where they fit)
    K=rnd(BC,D); Q=rnd(BR,D); DO=rnd(BR,D)
    kt=Tile(BC,D); kt.fill(K); qt=Tile(BR,D); qt.fill(Q); dot=Tile(BR,D); dot.fill(DO)
    pt=Tile(BR,BC)
    S_ref=[[sum(Q[i][c]*K[j][c] for c in range(D)) for j in range(BC)] for i in range(BR)]
    for w in range(WARPS):
        score_row,score_col=(w//4)*(BR//2),(w%4)*32
        smt=BR//32
        s=warp_tile_abt(smt,4,D,qt,score_row,kt,score_col)
        assert close(tile_matrix(s,4),[r[score_col:score_col+32] for r in S_ref[score_row:score_row+BR//2]]),("S",D,BR,w)
        # the P store (S standing in for P), as the kernel writes it
        for m in range(smt):
            for L in range(32):
                g,t=L//4,L%4
                for h in range(2):
                    for nb in range(4):
                        row=score_row+m*16+g+8*h; col=score_col+nb*8+2*t
                        pt.set(row,col,s[m][L][nb][2*h]); pt.set(row,col+1,s[m][L][nb][2*h+1])
    assert all(x is not None for row in pt.phys for x in row)
    # dV = P^T dO: 32 keys x d/2 per warp, P read transposed
    for w in range(WARPS):
        grad_key,grad_dim=(w%4)*32,(w//4)*(D//2)
        dv=warp_tile_ab(2,D//16,BR,True,pt,grad_key,dot,grad_dim)
        ref=[[sum(S_ref[i][key]*DO[i][grad_dim+c] for i in range(BR)) for c in range(D//2)] for key in range(grad_key,grad_key+32)]
        assert close(tile_matrix(dv,D//16),ref),("dV",D,BR,w)
    # dQ share = dS K (S standing in for dS), dS read as stored
    wc=2 if D==32 or D<BR else 4; wr=WARPS//wc; mt=BR//16//wr; nbq=D//8//wc
    part=mt*nbq*4*32; accum=[None]*(WARPS*part)
    for w in range(WARPS):
        dq_row,dq_dim=(w//wc)*mt*16,(w%wc)*nbq*8
        dq=warp_tile_ab(mt,nbq,BC,False,pt,dq_row,kt,dq_dim)
        ref=[[sum(S_ref[i][key]*K[key][dq_dim+c] for key in range(BC)) for c in range(nbq*8)] for i in range(dq_row,dq_row+16*mt)]
        assert close(tile_matrix(dq,nbq),ref),("dQ share",D,BR,w)
        # DqShare's accumulator layout: warp w's part from w * part, lane L's acc[m][nb][0..3] as
        # float4 number (m * nbq + nb) * 32 + L
        for m in range(mt):
            for L in range(32):
                for nb in range(nbq):
                    for c in range(4): accum[w*part+((m*nbq+nb)*32+L)*4+c]=dq[m][L][nb][c]
    # convert_dq_kernel's index arithmetic puts every element of the tile back in its row, once
    out=[[None]*D for _ in range(BR)]
    for i in range(BR*D//4):
        in_tile=i%(BR*D//4); warp=in_tile//(part//4); frag=in_tile%(part//4)//32; lane=in_tile%32
        row=(warp//wc)*mt*16+frag//nbq*16+lane//4
        dim=(warp%wc)*nbq*8+frag%nbq*8+2*(lane%4)
        for h in range(2):
            for e in range(2):
                assert out[row+8*h][dim+e] is None,("dQ layout overlaps",D,BR,i)
                out[row+8*h][dim+e]=accum[4*i+2*h+e]
    ref=[[sum(S_ref[i][key]*K[key][c] for key in range(BC)) for c in range(D)] for i in range(BR)]
    assert close(out,ref),("dQ accumulator layout",D,BR)
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
